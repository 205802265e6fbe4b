"""configs/mine.py's variants."""

import pytest

from configs import mine


def test_real_llm_configs_differ_from_their_offline_twin_only_in_the_backends():
    """configs/mine.py's real-LLM runs (issue #38) and their offline twins share every size, so
    the two runs' metrics compare like with like; the two-hour size is larger everywhere."""
    for size in ("smollm2", "smollm2_2h"):
        llm, offline = mine.get_config(size), mine.get_config(f"{size}_offline")
        assert (llm.queries.backend, llm.judge.backend) == ("openai", "openai")
        assert offline.queries.backend != "openai" and offline.judge.backend != "openai"
        for section in ("data", "chunk", "mining", "train", "optim", "final_eval", "student"):
            assert llm[section] == offline[section], (size, section)
    small, large = mine.get_config("smollm2"), mine.get_config("smollm2_2h")
    for section, field in (("data", "max_docs"), ("data", "max_chunks_per_doc"),
                           ("queries", "per_doc"), ("train", "max_steps"),
                           ("final_eval", "min_pairs")):  # fmt: skip
        assert large[section][field] > small[section][field], (section, field)
    with pytest.raises(ValueError, match="unknown variant"):
        mine.get_config("smollm3")
