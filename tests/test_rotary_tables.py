"""Issue #23 follow-ups from the recall runs: tables of rank below 4, scaled (xpos) tables, starred shapes.

1. A table of lower rank than x (diffusers QwenImage's complex way: `freqs_cis.unsqueeze(1)`, (S, 1, D/2);
   a (S, D) table with x in BNSD) broadcasts in the original exactly as the table with leading 1s: the
   branch runs the kernel on it (it fell back before: the kernel and `_npu_rotary_fits` took 4-D tables
   only). Executed with `_is_npu` forced true and verify's CPU reference kernels as `torch_npu` (which
   refuses a table that is not 4-D, as the kernel does): fp32 cosine >= 0.999, bf16 >= 0.99, the kernel
   called once; with `_is_npu` false the migrated code gives the original's bits; and a broken rewrite
   (the sin table negated, the other rotary_mode) fails the same check.
2. audiocraft's xPos rotary multiplies by a complex table it computes, `rotation * decay * scale + (1 -
   scale)`: declined by what the table is (scaled and shifted by arithmetic, not a rotation alone), not by
   its names; its cast to `self.dtype`, which stopped the evaluator (silent), is read as kept only to say so.
3. k-diffusion's interleaved `rotate_half` views its stacked pairs back through `*shape, d, r = x.shape`:
   the starred unpack of a shape is read (the starred name only where every use unpacks it again), and
   the site, a window of the head from a parameter with scaled tables, is fused; executed the same way,
   with a moved window and a dropped scale among the broken rewrites.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from test_rotary_meaning import TORCH_NPU, _angles, _cosine, _migrated, _namespace

pytestmark = pytest.mark.integration  # needs torch: the `integration` extra

B, S, H, D = 2, 5, 3, 16

LOW_RANK = textwrap.dedent(
    """
    import torch


    def rope_seq_table(x, freqs_cis):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        freqs_cis = freqs_cis.unsqueeze(1)
        return torch.view_as_real(xc * freqs_cis).flatten(3).type_as(x)


    def rope_flat_table(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    """
)


def _x(dtype, layout="BSND"):
    x = (3 * torch.randn(B, S, H, D, generator=torch.Generator().manual_seed(2))).to(dtype)
    return x if layout == "BSND" else x.transpose(1, 2)


def _seq_complex(dtype):
    """QwenImage's freqs_cis: (S, D/2) complex, unsqueezed by the function to (S, 1, D/2): BSND's 1S1D."""
    theta = _angles()
    return (_x(dtype), torch.polar(torch.ones_like(theta), theta))


def _flat_real(dtype):
    """(S, D) tables with x in BNSD (B, H, S, D): the original's broadcast is the kernel's 11SD."""
    theta = _angles().repeat(1, 2)
    return (_x(dtype, "BNSD"), theta.cos().to(dtype), theta.sin().to(dtype))


#: function -> (its arguments by dtype, its mutants: wrong sign, wrong pairing)
LOW_RANK_CASES = {
    "rope_seq_table": (
        _seq_complex,
        {
            "sign": ("_npu_sin = _npu_t0.imag", "_npu_sin = -_npu_t0.imag"),
            "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
        },
    ),
    "rope_flat_table": (
        _flat_real,
        {
            "sign": ("_npu_rotary_mul(x, cos, sin,", "_npu_rotary_mul(x, cos, -sin,"),
            "pairing": ('rotary_mode="half"', 'rotary_mode="interleave"'),
        },
    ),
}


def _run_low_rank(name, dtype, mutate=None):
    args = LOW_RANK_CASES[name][0](dtype)
    text, _ = _migrated(LOW_RANK)
    expected = _namespace(LOW_RANK, forced=False)[name](*args)
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _namespace(text, forced=True, mutate=mutate)[name](*args)
    calls = TORCH_NPU.calls["npu_rotary_mul"] - before
    kept = _namespace(text, forced=False)[name](*args)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected), calls, torch.equal(kept, expected)


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", LOW_RANK_CASES)
def test_a_table_of_lower_rank_runs_the_kernel_as_the_table_with_leading_ones(name, dtype, floor):
    cosine, calls, kept = _run_low_rank(name, dtype)
    assert calls == 1  # fell back (0 calls) while the kernel and its check took 4-D tables only
    assert cosine >= floor, cosine
    assert kept


@pytest.mark.parametrize("broken", ["sign", "pairing"])
@pytest.mark.parametrize("name", LOW_RANK_CASES)
def test_a_broken_rewrite_of_a_lower_rank_table_fails_the_check(name, broken):
    cosine, calls, _ = _run_low_rank(name, torch.float32, mutate=LOW_RANK_CASES[name][1][broken])
    assert calls == 1
    assert cosine < 0.999, (name, broken, cosine)


def test_a_lower_rank_table_runs_the_kernel_only_where_its_shape_with_leading_ones_is_allowed():
    """A (S, D) table is 11SD: taken for x (B, N, S, D). A (D,) table is 111D: the kernel's 11SD only
    where S is 1, so with S = 5 the original runs, bit for bit."""
    text, _ = _migrated(LOW_RANK)
    theta = _angles().repeat(1, 2)  # (S, D)
    x = (3 * torch.randn(B, 4, S, D, generator=torch.Generator().manual_seed(5))).float()
    cos, sin = theta.cos(), theta.sin()
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _namespace(text, forced=True)["rope_flat_table"](x, cos, sin)
    assert TORCH_NPU.calls["npu_rotary_mul"] == before + 1
    assert _cosine(got, _namespace(LOW_RANK, forced=False)["rope_flat_table"](x, cos, sin)) >= 0.999
    flat = theta[0]
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _namespace(text, forced=True)["rope_flat_table"](x, flat.cos(), flat.sin())
    assert TORCH_NPU.calls["npu_rotary_mul"] == before
    assert torch.equal(got, _namespace(LOW_RANK, forced=False)["rope_flat_table"](x, flat.cos(), flat.sin()))


def test_low_rank_migration_is_idempotent():
    text, findings = _migrated(LOW_RANK)
    assert sum(f.fixed and "branch" in f.message for f in findings) == 2, [f.message for f in findings]
    again, _ = _migrated(text)
    assert again == text


#: k-diffusion's axial rotary, written here: an interleaved `rotate_half` that views the stacked pairs back
#: through a starred unpack of the shape (`*lead, d, r = t.shape`), a window of the head from a parameter,
#: the tables scaled.
STARRED = textwrap.dedent(
    """
    import torch


    def rotate_pairs(t):
        a, b = t[..., 0::2], t[..., 1::2]
        t = torch.stack((-b, a), dim=-1)
        *lead, d, r = t.shape
        return t.view(*lead, d * r)


    def rope_window(freqs, t, start=0, scale=1.0):
        freqs = freqs.to(t)
        end = start + freqs.shape[-1]
        left, t, right = t[..., :start], t[..., start:end], t[..., end:]
        t = (t * freqs.cos() * scale) + (rotate_pairs(t) * freqs.sin() * scale)
        return torch.cat((left, t, right), dim=-1)
    """
)


def _window_args(dtype, start=4):
    """(freqs (S, R) of R = D - 8 angles repeated per pair, x (B, H, S, D) in BNSD, start, scale)."""
    theta = _angles()[:, : (D - 8) // 2].repeat_interleave(2, dim=-1)
    return theta.to(dtype), _x(dtype, "BNSD"), start, 0.75


def _run_window(dtype, mutate=None, start=4):
    text, _ = _migrated(STARRED)
    args = _window_args(dtype, start)
    expected = _namespace(STARRED, forced=False)["rope_window"](*args)
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _namespace(text, forced=True, mutate=mutate)["rope_window"](*args)
    calls = TORCH_NPU.calls["npu_rotary_mul"] - before
    kept = _namespace(text, forced=False)["rope_window"](*args)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected), calls, torch.equal(kept, expected)


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
def test_a_starred_unpack_of_a_shape_is_read_and_the_scaled_window_fused(dtype, floor):
    text, findings = _migrated(STARRED)
    messages = [f.message for f in findings if f.rule_id == "NPU703"]
    # declined before: "`rotate_pairs` is not recognised as rotate_half ..."
    assert any(f.fixed and "interleaved rotary embedding gets a fused" in f.message for f in findings), messages
    assert 'rotary_mode="interleave"' in text
    for start in (0, 4):
        cosine, calls, kept = _run_window(dtype, start=start)
        assert calls == 1 and cosine >= floor and kept, (start, cosine, calls, kept)
    again, _ = _migrated(text)
    assert again == text


@pytest.mark.parametrize(
    "broken",
    [
        ("_npu_sin = _npu_t2.sin() * scale", "_npu_sin = -_npu_t2.sin() * scale"),  # the sign
        ('rotary_mode="interleave"', 'rotary_mode="half"'),  # the pairing
        ("_npu_cos = _npu_t2.cos() * scale", "_npu_cos = _npu_t2.cos()"),  # the scale dropped
        ("_npu_x0 = t[..., start:_npu_t1]", "_npu_x0 = t[..., start - 2:_npu_t1 - 2]"),  # the window moved
    ],
    ids=["sign", "pairing", "scale", "window"],
)
def test_a_broken_rewrite_of_the_starred_window_fails_the_check(broken):
    cosine, calls, _ = _run_window(torch.float32, mutate=broken)
    assert calls == 1
    assert cosine < 0.999, (broken, cosine)


def test_a_starred_shape_read_as_a_list_is_not_guessed():
    """`*lead, d, r = t.shape` binds a list: `lead + [d * r]` is list arithmetic, which a slice of the
    shape (a torch.Size) would not do alike, so the helper is not read, and the finding says so."""
    source = STARRED.replace("return t.view(*lead, d * r)", "return t.view(lead + [d * r])")
    text, findings = _migrated(source)
    assert text == source
    messages = [f.message for f in findings if f.rule_id == "NPU703"]
    assert any("`rotate_pairs` is not recognised" in m for m in messages), messages


#: audiocraft's rotary with xPos, written here: the complex table decayed per position and mixed with 1
#: (`rotation * decay * scale + (1 - scale)`), x cast to a dtype the module holds, the decay chosen by `if`s.
AFFINE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Rope(nn.Module):
        def rotate(self, x, start: int = 0, invert: bool = False):
            steps = x.shape[1]
            rotation = self.table(start, start + steps).view(1, steps, 1, -1)
            if self.decays is not None:
                decay = self.decays(start, start + steps).view(1, steps, 1, -1)
            else:
                decay = 1.0
            if invert:
                decay = decay**-1
            xc = torch.view_as_complex(x.to(self.dtype).reshape(*x.shape[:-1], -1, 2))
            mixed = (rotation * decay) * self.scale + (1.0 - self.scale)
            return torch.view_as_real(xc * mixed).view_as(x).type_as(x)
    """
)


def test_a_complex_table_scaled_and_shifted_by_arithmetic_is_declined_with_what_it_is():
    """Silent before (the cast to `self.dtype` stopped the run); now read with the cast kept, and declined
    by what the table is: a table scaled and shifted, not a rotation alone, whatever it is named."""
    for source in (AFFINE, AFFINE.replace("rotation", "a").replace("decay", "b").replace("mixed", "c")):
        text, findings = _migrated(source)
        assert text == source
        messages = [f.message for f in findings if f.rule_id == "NPU703"]
        assert len(messages) == 1 and not any(f.fixed for f in findings), messages
        (message,) = messages
        assert "is a table scaled and shifted (`+ (1.0 - self.scale)`) by arithmetic in the code" in message
        assert "not a rotation alone" in message and "; to fuse it, multiply by the rotation table alone" in message
    # the same table written with `.float()`: the same reason (it said before only that complexness cannot
    # be checked, and to bind the table to a name, which the code does)
    _, findings = _migrated(AFFINE.replace("x.to(self.dtype)", "x.float()"))
    assert any("scaled and shifted" in f.message for f in findings), [f.message for f in findings]
    # scaled only
    _, findings = _migrated(AFFINE.replace(" + (1.0 - self.scale)", ""))
    assert any("is a table scaled by arithmetic" in f.message for f in findings), [f.message for f in findings]


def test_a_pure_rotation_cast_to_a_dtype_not_known_is_declined_with_the_cast():
    """Without the decay and the mix, the rotation is the kernel's: what stops it is the cast to a dtype the
    module holds, which the finding names (silent before)."""
    source = AFFINE.replace("xc * mixed", "xc * rotation")
    text, findings = _migrated(source)
    assert text == source
    messages = [f.message for f in findings if f.rule_id == "NPU703"]
    assert any("x is cast to the dtype `self.dtype`, which is not known here" in m for m in messages), messages
    assert any("; to fuse it, cast with a dtype the code names" in m for m in messages), messages
    # with the dtype named, it is fused (the cast was the reason)
    text, findings = _migrated(source.replace("x.to(self.dtype)", "x.float()"))
    assert any(f.fixed and "branch" in f.message for f in findings), [f.message for f in findings]


#: fairseq / ESM's rotary, written here: x is [B * heads, S, D] (3-D), the tables [1, S_max, D] cut to x's
#: length. The rotation is proven on a 4-D x only, and code that names dims (`flatten(3)`, `x[:, :, :, ::2]`)
#: computes something else at a lower rank, so a 3-D x keeps the original: bit for bit, no kernel call.
FLAT_HEADS = textwrap.dedent(
    """
    import torch


    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)


    def rope_flat_heads(x, cos, sin):
        cos = cos[:, : x.shape[-2], :]
        sin = sin[:, : x.shape[-2], :]
        return (x * cos) + (rotate_half(x) * sin)


    def rope_complex(x, freqs_cis):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs_cis).flatten(3).type_as(x)
    """
)


def test_an_x_of_lower_rank_keeps_the_original():
    text, findings = _migrated(FLAT_HEADS)
    assert sum(f.fixed and "branch" in f.message for f in findings) == 2, [f.message for f in findings]
    theta = torch.cat((_angles(), _angles()), dim=-1)  # (S, D), halves repeated
    x = 3 * torch.randn(B * H, S, D, generator=torch.Generator().manual_seed(7))
    freqs = torch.polar(torch.ones_like(_angles()), _angles())  # (S, D / 2)
    for name, args in (
        ("rope_flat_heads", (x, theta.cos()[None], theta.sin()[None])),
        # Llama's spelling on a 3-D x: the original's `flatten(3)` leaves [BH, S, D / 2, 2], not x's shape
        ("rope_complex", (x, freqs)),
    ):
        expected = _namespace(FLAT_HEADS, forced=False)[name](*args)
        before = TORCH_NPU.calls["npu_rotary_mul"]
        got = _namespace(text, forced=True)[name](*args)
        assert TORCH_NPU.calls["npu_rotary_mul"] == before, name
        assert got.shape == expected.shape and torch.equal(got, expected), name
