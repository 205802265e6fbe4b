"""The LLM server's launcher without llama.cpp: its log goes to a folder that need not exist yet
(`--log runs/<new run>/server.log` on a fresh clone), and a server that exits on start is
reported with its exit status and the log's tail."""

import stat

import pytest

from caliber_jax.mining import llm_server


def test_a_server_that_exits_on_start_is_reported_with_its_log_in_a_new_folder(tmp_path):
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\necho 'fake server: no model here'\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "runs" / "mine_new" / "server.log"
    server = llm_server.LlamaServer(model_path=tmp_path / "model.gguf", port=8029,
                                    startup_seconds=30, log_path=log, python=str(fake))  # fmt: skip
    with pytest.raises(RuntimeError, match="exited with 3 on start") as raised:
        server.start()
    assert "fake server: no model here" in str(raised.value)
    assert log.read_text() == "fake server: no model here\n"
