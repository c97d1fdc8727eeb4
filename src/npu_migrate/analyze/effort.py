"""How hard the move to Ascend is: a rating (Low / Medium / High) and a range of person-days, from the facts
the modes found, with the work items that make it up in the words a report shows.

A stated heuristic for planning, not a measurement. Each kind of work a person must do has a range of days
per item (`WEIGHTS`); repeated small items are capped, because their cost is learning the fix once and
applying it, not a day per site; what `npu-migrate apply` rewrites costs only reading the diff. The
rating follows the upper end of the range (`BANDS`), so the reader can check it against the items listed.

Calibrated on the projects under `fixtures/projects/` and `examples/`, and on transformers (one model
package and the whole library): see `tests/test_effort.py` for the ratings those trees get and why.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Rating by the upper end of the estimate, at most this many person-days (None: any more): Low is a week
#: of work at most, Medium up to two person-months, High more.
BANDS = (("Low", 5.0), ("Medium", 40.0), ("High", None))


@dataclass(frozen=True)
class Weight:
    """Person-days for one item of a kind of work, as (low, high), and an optional cap on the kind's total."""

    explains: str  # the kind of work, for the report's "how this is estimated"
    per_item: tuple[float, float]
    cap: tuple[float, float] | None = None


WEIGHTS = {
    "npu_test": Weight("run the project's tests and a training step on an NPU (once)", (0.5, 1.0)),
    "rewrite_review": Weight(
        "each site `npu-migrate apply` rewrites: read its diff (a few minutes)", (0.005, 0.01), cap=(3.0, 5.0)
    ),
    "complex_kernel": Weight(
        "each CUDA kernel using shared memory, warp shuffles, atomics, tensor cores or CUDA libraries: "
        "rewrite in Ascend C",
        (2.0, 6.0),
    ),
    "simple_kernel": Weight(
        "each plain (element-wise) CUDA kernel: usually a few torch operators, or a short Ascend C kernel",
        (1.0, 2.0),
    ),
    "triton_kernel": Weight("each triton kernel: port with triton-ascend or rewrite with torch operators", (1.0, 3.0)),
    "native_build": Weight(
        "each CUDA extension build or C++ binding: build with NpuExtension, register the operators for the NPU",
        (0.5, 1.0),
    ),
    "package_without_alternative": Weight(
        "each CUDA-only package with no Ascend counterpart: replace what it does", (2.0, 5.0)
    ),
    "package_with_alternative": Weight(
        "each CUDA-only package with an Ascend counterpart: switch to it and compare results", (0.5, 2.0)
    ),
    "unsupported_api": Weight(
        "each distinct torch API with no NPU support: find a workaround", (0.25, 1.0), cap=(5.0, 15.0)
    ),
    "unsupported_library_function": Weight(
        "each library function the code calls that cannot run on an NPU: replace or rewrite it",
        (0.5, 2.0),
        cap=(5.0, 20.0),
    ),
    "distributed": Weight("distributed training: HCCL setup and a multi-card run (once)", (1.0, 3.0)),
    "dynamic_shape": Weight(
        "each data-dependent shape: measure it and pad to a few fixed sizes", (0.1, 0.25), cap=(2.0, 5.0)
    ),
    "fused_declined": Weight(
        "each fused-kernel candidate the codemod left alone: apply it by hand if it pays", (0.1, 0.25), cap=(1.0, 3.0)
    ),
    "sync_in_loop": Weight(
        "each host-device sync inside a loop: log less often or keep the value on the device",
        (0.05, 0.1),
        cap=(0.5, 1.0),
    ),
}


@dataclass(frozen=True)
class Item:
    """One line of the estimate: what must be done, how many of it, and the days it adds."""

    kind: str
    what: str
    count: int
    days: tuple[float, float]


def item(kind: str, what: str, count: int = 1) -> Item:
    weight = WEIGHTS[kind]
    low, high = weight.per_item[0] * count, weight.per_item[1] * count
    if weight.cap is not None:
        low, high = min(low, weight.cap[0]), min(high, weight.cap[1])
    return Item(kind, what, count, (low, high))


def _round(days: float) -> float:
    """Hours under a day, half days up to ten, whole days above: the estimate is no more precise than that."""
    if days < 1:
        return round(days, 2)
    return round(days * 2) / 2 if days < 10 else float(round(days))


def _days(pair: tuple[float, float]) -> str:
    low, high = (_round(d) for d in pair)
    return f"{low:g} person-day" if low == high == 1 else f"{low:g}-{high:g} person-days"


def rate(items: list[Item], automatic: int) -> dict:
    """The rating and estimate for the work `items`, the review of `automatic` rewritten sites, and a test run.

    `reasons` lists the items with their days, the largest first: the first one is what drives the rating.
    """
    if automatic:
        items = [
            *items,
            item("rewrite_review", f"review the {automatic} sites `npu-migrate apply` rewrites", automatic),
        ]
    work = sorted(items, key=lambda i: (-i.days[1], -i.days[0], i.what))
    test = item("npu_test", "test on an NPU")
    low = _round(sum(i.days[0] for i in (*work, test)))
    high = _round(sum(i.days[1] for i in (*work, test)))
    rating = next(name for name, limit in BANDS if limit is None or high <= limit)
    reasons = [f"{i.what}: {_days(i.days)}" for i in work] or ["no CUDA-specific code found"]
    reasons.append(f"{test.what}: {_days(test.days)}")
    return {
        "rating": rating,
        "reasons": reasons,
        "drivers": [i.kind for i in work],
        "effort_days": [low, high],
        "effort": _days((low, high)),
        "heuristic": heuristic(),
    }


def heuristic() -> list[str]:
    """How the estimate is made, in words for the report."""
    lines = []
    for weight in WEIGHTS.values():
        low, high = weight.per_item
        line = f"{low:g}-{high:g} days: {weight.explains}"
        if weight.cap is not None:
            line += f" (at most {weight.cap[0]:g}-{weight.cap[1]:g} days in all)"
        lines.append(line)
    lines.append("what `npu-migrate apply` rewrites needs no hand work beyond reading the diff")
    limits = [f"{name} up to {limit:g} days" for name, limit in BANDS if limit is not None]
    lines.append(
        f"the rating follows the upper end of the range: {', '.join(limits)}, {BANDS[-1][0]} above that "
        f"(more than about {BANDS[-2][1] / 5:g} person-weeks)"
    )
    return lines
