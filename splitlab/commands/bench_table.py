"""`splitlab bench`'s tables: one run's measurements as text, and many runs side by side in markdown
(``make gpu-check``'s summary). Kept beside the command, apart from the run summary of `splitlab.report`."""

from __future__ import annotations

from typing import Any


def format_bench(r: dict[str, Any]) -> str:
    """The measurements as a text table."""
    rows = [*_speed_rows(r), *_cost_rows(r), *_predict_rows(r), *_vqa_rows(r)]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _speed_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """What ran (model, device, backend, tokens) and how fast, against the FLOP ideals."""
    cfg = r["config"]
    rows = [
        (
            "model",
            f"{cfg['model'] if not cfg['ckpt'] else cfg['ckpt']} @ {cfg['img_size'][0]} px, levels {tuple(cfg['levels'])}",
        ),
        *([("checkpoint holds", r["holds"])] if r.get("holds") else []),
        ("device / dtype / batch", f"{r['device_name']} / {cfg['dtype']} / {cfg['batch_size']}"),
        ("attention backend", r["attn_backend"]),
        (
            "token fraction",
            f"{r['token_fraction']:.3f} ({r['tokens_split_mean']:.1f} of {r['tokens_uniform']} tokens)",
        ),
        ("uniform (timm) img/s", f"{r['throughput_uniform']:.2f}"),
        ("SPLIT img/s", f"{r['throughput_split']:.2f}"),
        ("speed-up", f"{r['speedup']:.3f}x"),
        (
            "ideal (FLOP) speed-up",
            f"{r['ideal_speedup']:.3f}x  (achieved {r['speedup_over_ideal']:.1%} of ideal)",
        ),
    ]
    if "dense_ideal" in r:
        rows.append(
            (
                "dense ideal speed-up",
                f"{r['dense_ideal']['speedup']:.3f}x  (timm's blocks at {r['dense_ideal']['tokens_per_image']} "
                f"against {r['dense_ideal']['tokens_per_image_uniform']} tokens; achieved "
                f"{r['speedup_over_dense_ideal']:.1%} of it)",
            )
        )
    return rows


def _cost_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Where the SPLIT path's time goes, and its memory, host syncs and page faults."""
    t = r["time_ms"]
    mem = (
        f"{r['peak_memory_mib_uniform']:.0f} / {r['peak_memory_mib_split']:.0f} MiB"
        if r["peak_memory_mib_uniform"] is not None
        else "n/a on CPU"
    )
    rows = [
        (
            "time embed/decide/walk/backbone",
            f"{t['embed']:.1f} / {t['decide']:.1f} / {t['walk']:.1f} / {t['backbone']:.1f} ms",
        ),
        (
            "overhead / backbone",
            f"{r['overhead_fraction']:.1%} ({r['overhead_beyond_uniform_fraction']:.1%} beyond the "
            f"patch embedding, {t['patch_embed']:.1f} ms, that timm's forward also runs)",
        ),
        ("peak memory uniform / SPLIT", mem),
        (
            "host syncs per SPLIT batch",
            "n/a on CPU" if r.get("host_syncs_per_batch") is None else str(r["host_syncs_per_batch"]),
        ),
    ]
    if r.get("page_faults_per_batch_uniform") is not None:
        rows.append(
            (
                "page faults per batch uniform / SPLIT",
                f"{r['page_faults_per_batch_uniform']} / {r['page_faults_per_batch_split']} "
                f"(freed memory {'kept' if r.get('freed_memory_kept') else 'given back: --system-malloc, or not glibc'})",
            )
        )
    return rows


def _predict_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """``--predict``'s end-to-end numbers (none without it)."""
    if "predict" not in r:
        return []
    e = r["predict"]
    return [
        (
            "predict end to end img/s",
            f"uniform {e['images_per_second_uniform']:.2f} / SPLIT {e['images_per_second_split']:.2f} "
            f"({e['images']} files at fraction {e['token_fraction']:.3f}, {e['workers']} decoding worker(s))",
        ),
        (
            "predict speed-up",
            f"{e['speedup']:.3f}x  ({e['share_of_backbone_speedup']:.1%} of the backbone speed-up)",
        ),
    ]


def _vqa_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """``--lm``'s VQA path numbers (none without it)."""
    if "vqa" not in r:
        return []
    v = r["vqa"]
    return [
        ("VQA (ViT + projector + LM prefill)", f"{v['lm_width']}-wide LM, {v['text_tokens']} text tokens"),
        (
            "VQA img/s uniform / SPLIT",
            f"{v['images_per_second_uniform']:.2f} / {v['images_per_second_split']:.2f}",
        ),
        ("VQA speed-up", f"{v['speedup']:.3f}x"),
    ]


def bench_table(records: list[dict[str, Any]]) -> str:
    """`splitlab bench` results side by side, as a markdown table (``make gpu-check``'s summary); a
    ``--batch-sizes`` sweep's JSON gives one row per batch size."""
    lines = [
        "| model | px | batch | dtype | backend | compile | fraction | uniform img/s | SPLIT img/s | speed-up "
        "| FLOP-ideal | of ideal | overhead | peak MiB uniform / SPLIT | host syncs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = (row for record in records for row in record.get("sweep", [record]))
    for r in (row for row in rows if "dense" not in row):  # a detector's or segmenter's: format_dense_run
        c = r["config"]
        memory = (
            f"{r['peak_memory_mib_uniform']:.0f} / {r['peak_memory_mib_split']:.0f}"
            if r.get("peak_memory_mib_uniform") is not None
            else "n/a"
        )
        syncs = r.get("host_syncs_per_batch")
        lines.append(
            f"| {c['model']} | {c['img_size'][0]} | {c['batch_size']} | {c['dtype']} | {r['attn_backend']} | "
            f"{'yes' if c['compile'] else 'no'} | {r['token_fraction']:.3f} | {r['throughput_uniform']:.1f} | "
            f"{r['throughput_split']:.1f} | {r['speedup']:.3f}x | {r['ideal_speedup']:.3f}x | "
            f"{r['speedup_over_ideal']:.1%} | {r['overhead_fraction']:.1%} | {memory} | "
            f"{'n/a' if syncs is None else syncs} |"
        )
    return "\n".join(lines)


def format_sweep(records: list[dict[str, Any]]) -> str:
    """One row per batch size of a ``--batch-sizes`` sweep: the speed-up of the typical timed pair
    (the median of the per-pair ratios, uniform then SPLIT back to back on the same batch) with its
    quartiles, the FLOP-ideal and the share of it (and, with ``--dense-ideal``, the dense ideal's
    median and the share of that), the overhead, latency per image. The median: on a shared host a
    burst of other work slows a few pairs, which a ratio of summed times counts in full (the img/s
    columns are the summed times')."""
    first = records[0]
    cfg = first["config"]
    dense = "dense_ideal" in first
    lines = [
        f"{cfg['model']} @ {cfg['img_size'][0]} px, levels {tuple(cfg['levels'])}, {first['device_name']}, "
        f"{cfg['dtype']}, budget {cfg['budget']}",
        "| batch | backend | fraction | uniform img/s | SPLIT img/s | speed-up, median (q1-q3, pairs) | FLOP-ideal "
        "| of ideal | "
        + ("dense ideal | of dense ideal | " if dense else "")
        + "overhead (beyond uniform) | ms/img uniform / SPLIT |",
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if dense else ""),
    ]
    for r in records:
        q = r["speedup_spread"]
        ideal = (
            f"{r['dense_ideal']['speedup_spread']['median']:.3f}x | {r['speedup_median_over_dense_ideal']:.1%} | "
            if "dense_ideal" in r
            else ""
        )
        lines.append(
            f"| {r['config']['batch_size']} | {r['attn_backend']} | {r['token_fraction']:.3f} | "
            f"{r['throughput_uniform']:.2f} | {r['throughput_split']:.2f} | {q['median']:.3f}x "
            f"({q['q1']:.3f}-{q['q3']:.3f}, {q['pairs']}) | {r['ideal_speedup']:.3f}x | "
            f"{r['speedup_median_over_ideal']:.1%} | {ideal}{r['overhead_fraction']:.1%} "
            f"({r['overhead_beyond_uniform_fraction']:.1%}) | "
            f"{r['latency_ms_per_image_uniform']:.1f} / {r['latency_ms_per_image_split']:.1f} |"
        )
    return "\n".join(lines)
