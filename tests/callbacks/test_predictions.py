"""`LayoutWriter`: one JSON-lines file per rank, started afresh by each predict run."""

from __future__ import annotations

import json
from types import SimpleNamespace

from splitlab.callbacks import LayoutWriter


def predict(writer: LayoutWriter, rank: int, world_size: int, log_dir, batches, indices=None) -> None:
    trainer = SimpleNamespace(global_rank=rank, world_size=world_size, log_dir=str(log_dir))
    writer.on_predict_start(trainer, None)
    for index, records in enumerate(batches):
        writer.write_on_batch_end(trainer, None, records, indices and indices[index], None, index, 0)


def test_each_rank_writes_its_own_file_and_a_new_run_starts_it_afresh(tmp_path) -> None:
    for rank in (0, 1):  # two DDP ranks sharing a log dir must not interleave in one file
        predict(LayoutWriter(), rank, 2, tmp_path, [[{"rank": rank, "i": 0}], [{"rank": rank, "i": 1}]])
    for rank in (0, 1):
        lines = (tmp_path / f"layouts.rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == [{"rank": rank, "i": 0}, {"rank": rank, "i": 1}]
    writer = LayoutWriter(output_dir=str(tmp_path / "out"))
    predict(writer, 0, 1, tmp_path, [[{"i": 0}, {"i": 1}]])
    predict(writer, 0, 1, tmp_path, [[{"i": 2}]])  # the second run replaces the first
    assert (tmp_path / "out" / "layouts.jsonl").read_text().splitlines() == ['{"i": 2}']
    assert not (tmp_path / "layouts.jsonl").exists()


def test_each_record_names_its_image_and_an_unusable_one_has_none(tmp_path) -> None:
    """Under DDP rank 1 predicts samples 1, 3, 5, ...: each batch carries its samples' dataset index
    and file (`Sourced`), and an unreadable file is left out of its batch, not replaced by the next."""
    import pytest
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from splitlab.data.common import SkipCorrupt, Sourced, SourcedCollate

    class Files(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int):
            if i == 3:
                raise OSError("cannot identify image file")
            return torch.full((2,), float(i)), i

    data = SkipCorrupt(Files(), lambda i: f"img{i}.png")
    sampler = DistributedSampler(Sourced(data), num_replicas=2, rank=1, shuffle=False)
    loader = DataLoader(Sourced(data), batch_size=2, sampler=sampler, collate_fn=SourcedCollate(None))
    with pytest.warns(UserWarning, match="skipping img3.png"):
        batches = list(loader)
    sources = [s for _, _, found in batches for s in found]
    assert sources == [{"dataset_index": 1, "file": "img1.png"}, {"dataset_index": 5, "file": "img5.png"}]
    assert [v.tolist() for images, _, _ in batches for v in images] == [[1.0, 1.0], [5.0, 5.0]]
    assert data.take_count() == 1
