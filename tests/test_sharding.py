"""Sharding rules: hidden-axis embeddings, logged fallbacks, born-sharded params, batch rows."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from caliber_jax import sharding


def test_embeddings_split_on_the_hidden_axis_and_fallbacks_are_logged(caplog):
    mesh = sharding.make_mesh(fsdp=4)
    abstract = {
        "embed_tokens": {"embedding": jax.ShapeDtypeStruct((151_669, 64), np.float32)},
        "q_proj": {"kernel": jax.ShapeDtypeStruct((64, 32), np.float32)},
        "odd": {"kernel": jax.ShapeDtypeStruct((6, 32), np.float32)},
        "norm": {"scale": jax.ShapeDtypeStruct((64,), np.float32)},
    }
    with caplog.at_level("WARNING"):
        found = sharding.param_shardings(mesh, abstract)
    assert found["embed_tokens"]["embedding"].spec == P(None, "fsdp")
    assert found["q_proj"]["kernel"].spec == P("fsdp", None)
    assert found["odd"]["kernel"].spec == P(None, None)
    assert found["norm"]["scale"].spec == P(None)
    assert "odd.kernel (6, 32): dimension 6 does not divide over fsdp=4" in caplog.text
    assert caplog.text.count("does not divide") == 1  # nothing else fell back


def test_put_sharded_gives_each_device_only_its_shard():
    mesh = sharding.make_mesh(fsdp=4)
    host = {"w": {"kernel": np.arange(8 * 3, dtype=np.float32).reshape(8, 3)}}
    shardings = sharding.param_shardings(mesh, host)
    placed = sharding.put_sharded(host, shardings)["w"]["kernel"]
    assert placed.sharding == shardings["w"]["kernel"]
    for shard in placed.addressable_shards:
        assert shard.data.shape == (2, 3)
        np.testing.assert_array_equal(np.asarray(shard.data), host["w"]["kernel"][shard.index])


def test_one_process_holds_every_batch_row_in_order():
    devices = jax.devices()
    mesh = sharding.make_mesh(fsdp=2, devices=devices[::-1])
    rows = sharding.process_batch_rows(mesh, 16)
    np.testing.assert_array_equal(rows, np.arange(16)[None])
