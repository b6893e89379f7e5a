"""RecordCache (fastvideo.data.cache): the byte-bounded cache of loaded records that keeps what it
admitted, on its own."""

import threading

import pytest
import torch

from fastvideo.data.cache import RecordCache, record_nbytes


def rec(n: int, fill: float = 0.0, dtype=torch.float32) -> dict:
    """A record of n elements in two tensors (n - 2 and 2), n * itemsize bytes."""
    return {"a": torch.full((n - 2,), fill, dtype=dtype), "b": torch.full((2,), fill, dtype=dtype)}


def test_record_nbytes_counts_each_storage_once():
    assert record_nbytes(rec(10)) == 40 and record_nbytes(rec(10, dtype=torch.bfloat16)) == 20
    t = torch.zeros(8)
    assert record_nbytes({"x": t, "y": t}) == 32  # the same tensor twice: one storage
    big = torch.zeros(100)
    assert record_nbytes({"row": big[:4]}) == 400  # a view keeps its whole storage alive
    assert record_nbytes({"e": torch.zeros(4, 3).expand(2, 4, 3)}) == 48


def test_hits_misses_and_bytes():
    c = RecordCache(1000)
    assert c.enabled and c.get(0) is None and (c.hits, c.misses) == (0, 1)
    r = rec(10, 1.0)
    assert c.put(0, r) and c.nbytes == 40 and len(c) == 1 and 0 in c
    got = c.get(0)
    assert (c.hits, c.misses) == (1, 1)
    assert got.keys() == r.keys() and all(got[k] is r[k] for k in r)  # the held tensors, no copy
    assert c.put(1, rec(25)) and c.nbytes == 140
    assert c.put(0, rec(5)) and c.nbytes == 120 and len(c) == 2  # replacing a key re-counts it
    assert c.stats() == {"hits": 1, "misses": 1, "refused": 0, "records": 2, "bytes": 120,
                         "budget_bytes": 1000}


def test_a_returned_dict_is_the_callers():
    c = RecordCache(1000)
    c.put("k", rec(4, 2.0))
    first = c.get("k")
    first["a"] = torch.full((2,), -1.0)
    del first["b"]
    again = c.get("k")
    assert set(again) == {"a", "b"} and torch.equal(again["a"], torch.full((2,), 2.0))


def test_admitted_records_stay_and_later_ones_wait_for_room():
    c = RecordCache(120)  # three records of 40 bytes
    for k in "abc":
        assert c.put(k, rec(10))
    assert not c.put("d", rec(10))  # full: refused, nothing evicted
    assert c.keys() == ["a", "b", "c"] and "d" not in c and c.refused == 1 and c.nbytes == 120
    for _ in range(3):  # asking for others does not move anything out
        assert c.get("d") is None
    assert c.get("a") is not None and c.get("c") is not None and c.keys() == ["a", "b", "c"]


def test_room_is_exact_and_a_replaced_key_gives_its_room_back():
    c = RecordCache(100)
    c.put(1, rec(10))  # 40
    c.put(2, rec(10))  # 40 -> 80
    assert c.put(3, rec(5)) and c.keys() == [1, 2, 3] and c.nbytes == 100  # 20 fits exactly
    assert not c.put(4, rec(1 + 2)) and c.nbytes == 100  # 12 bytes: no room left
    assert c.put(2, rec(10, 3.0)) and c.nbytes == 100 and c.get(2)["a"][0] == 3.0  # 40 fits 0 + its own 40
    assert not c.put(1, rec(11)) and c.get(1)["a"].numel() == 8  # 44 > 0 + 40: the old record stays


def test_a_record_over_the_budget_is_not_cached():
    c = RecordCache(100)
    c.put("small", rec(10))
    assert not c.put("huge", rec(26))  # 104 bytes > 100
    assert "huge" not in c and c.keys() == ["small"] and c.nbytes == 40 and c.refused == 1
    assert not c.put("whole", rec(25))  # exactly the budget, but 40 bytes are taken
    assert c.put("rest", rec(15)) and c.nbytes == 100  # exactly the room left


def test_budget_zero_is_off():
    c = RecordCache(0)
    assert not c.enabled
    assert not c.put(0, rec(3)) and not c.put(1, {"x": torch.zeros(0)})
    assert len(c) == 0 and c.nbytes == 0 and c.get(0) is None


def test_negative_budget_is_refused():
    with pytest.raises(ValueError, match=">= 0"):
        RecordCache(-1)


def test_threads_keep_the_accounting():
    c = RecordCache(400)
    sizes = {k: 4 * (3 + k % 7) for k in range(64)}

    def work(offset):
        for i in range(200):
            k = (i * 7 + offset) % 64
            if c.get(k) is None:
                c.put(k, rec(sizes[k] // 4))

    threads = [threading.Thread(target=work, args=(o,)) for o in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.nbytes == sum(sizes[k] for k in c.keys()) <= 400
    assert c.hits + c.misses == 800
