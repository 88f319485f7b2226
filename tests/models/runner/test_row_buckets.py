"""Row counts rounded up to a fixed set of sizes (oneDNN builds and caches a kernel per size)."""

from __future__ import annotations

import torch

from models.runner.row_buckets import bucket_rows, pad_rows


def test_the_sizes_are_few_and_never_much_more_than_the_rows() -> None:
    sizes = {bucket_rows(rows) for rows in range(1, 2049)}
    assert len(sizes) == 48
    assert [bucket_rows(rows) for rows in (1, 8, 9, 64, 65, 128, 129, 2048)] == [8, 8, 16, 64, 72, 128, 144, 2048]
    assert all(bucket_rows(rows) >= rows for rows in range(1, 5000))
    assert max(bucket_rows(rows) - rows for rows in range(1, 65)) == 7
    assert max(bucket_rows(rows) / rows for rows in range(65, 5000)) <= 1.125
    assert all(bucket_rows(size) == size for size in sizes)  # a size is its own bucket


def test_padding_appends_fill_rows_and_keeps_a_full_bucket_as_it_is() -> None:
    x = torch.arange(10.0).reshape(5, 2)
    padded = pad_rows(x, fill=3)
    assert padded.shape == (8, 2)
    assert torch.equal(padded[:5], x) and bool((padded[5:] == 3).all())
    full = torch.ones(16, 2)
    assert pad_rows(full) is full
