"""Issue #23: rotary embeddings recognised by what they compute, not by how they are spelled.

The spellings of the issue (complex numbers, a 2x2 rotation matrix per pair, interleaved pairs written out,
halves written out with the opposite sign convention, rotate_half nested or through einops) are migrated
with the engine and executed: `_is_npu` forced true with verify's CPU reference kernels as `torch_npu`,
against the original on random tables with large angles and activations: fp32 cosine >= 0.999, bf16 >=
0.99, the kernel called once per rotated tensor; with `_is_npu` false the migrated code gives the original's
bits. Each check is shown failing on a broken rewrite: the sin table negated (wrong sign), the other
rotary_mode (wrong pairing), the table repeated per half instead of per pair or the other way (wrong
repeat). A spelling written for this test only, never seen by the matcher while it was developed, must be
recognised too, and close-but-not-equal functions (a scaled term, another pairing) are declined with what
differs.
"""

from __future__ import annotations

import math
import re
import textwrap

import pytest
import test_rotary_window
import torch
import torch.nn.functional as F
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch and einops: the `integration` extra

TORCH_NPU = reference.torch_npu_module()

B, S, H, D = 2, 5, 3, 16  # BSND: the kernel's tables are (1, S, 1, D)

SOURCE = textwrap.dedent(
    '''
    import torch
    from einops import rearrange


    def rope_complex(x, freqs_cis):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        out = torch.view_as_real(xc * freqs_cis).flatten(3)
        return out.type_as(x)


    def rope_matrix(x, rot):
        """rot = stack([cos, -sin, sin, cos]).view(..., 2, 2): a 2x2 rotation per pair."""
        xp = x.float().reshape(*x.shape[:-1], -1, 1, 2)
        out = (rot[..., 0] * xp[..., 0] + rot[..., 1] * xp[..., 1]).reshape(*x.shape)
        return out.type_as(x)


    def rope_pairs(x, f):
        xs = x.float().reshape(*x.shape[:-1], -1, 2)
        out = torch.stack(
            [xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1], xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], -1
        ).flatten(3)
        return out.type_as(x)


    def rope_halves_opposite_sign(x, cos, sin):
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


    def rope_einops(x, cos, sin):
        x1, x2 = rearrange(x, "... (j d) -> ... j d", j=2).unbind(dim=-2)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


    def rope_written_into(x, freqs_cos, freqs_sin):
        """Wan's spelling: the pairs written element-wise into a new tensor."""
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        cos = freqs_cos[..., 0::2]
        sin = freqs_sin[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out.type_as(x)


    def rope_unflatten(x, cos, sin):
        x1, x2 = x.unflatten(-1, (2, -1)).unbind(-2)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


    def rope_shape_unpacked(x, cos, sin):
        batch, seq_len, heads, head_dim = x.shape
        assert head_dim % 2 == 0
        x1 = x[..., : head_dim // 2]
        x2 = x[..., head_dim // 2 :]
        cos = cos[:seq_len].unsqueeze(0).unsqueeze(2)
        sin = sin[:seq_len].unsqueeze(0).unsqueeze(2)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


    def rope_nested(x, cos, sin):
        def rotate_half(t):
            a, b = t.chunk(2, dim=-1)
            return torch.cat((-b, a), dim=-1)

        return x * cos + rotate_half(x) * sin
    '''
)

#: Written for this test after the evaluator was done, in no fixture: a flipped view of the pairs, the sign
#: put back by a stack, the tables repeated by `torch.repeat_interleave` inside the function.
NEW_SPELLING = textwrap.dedent(
    """
    import torch


    def rope_written_here(x, freqs):
        y = x.view(*x.shape[:-1], x.shape[-1] // 2, 2).flip(-1)
        y = torch.stack((-y[..., 0], y[..., 1]), dim=-1).view(x.shape)
        c, s = freqs.cos(), freqs.sin()
        return x * torch.repeat_interleave(c, 2, dim=-1) + y * s.repeat_interleave(2, -1)
    """
)


def _angles():
    return (torch.rand(S, D // 2, generator=torch.Generator().manual_seed(3)) * 2 - 1) * math.pi


def _half_tables(dtype):
    theta = _angles()[None, :, None, :]
    return theta.cos().to(dtype), theta.sin().to(dtype)


def _x(dtype):
    return (3 * torch.randn(B, S, H, D, generator=torch.Generator().manual_seed(2))).to(dtype)


def _complex_tables(dtype):
    theta = _angles()
    return (torch.polar(torch.ones_like(theta), theta)[None, :, None, :],)


def _matrix_tables(dtype):
    cos, sin = _half_tables(torch.float32)
    return (torch.stack([cos, -sin, sin, cos], dim=-1).view(1, S, 1, D // 2, 2, 2),)


def _pair_tables(dtype):
    cos, sin = _half_tables(torch.float32)
    return (torch.stack([cos, sin], dim=-1),)


def _full_tables(dtype):
    cos, sin = _half_tables(dtype)
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def _flat_tables(dtype):
    """(S, D) tables, sliced to the sequence and unsqueezed by the function (NeMo's `apply_rope`)."""
    cos, sin = _full_tables(dtype)
    return torch.cat((cos[0, :, 0], cos[0, :1, 0])), torch.cat((sin[0, :, 0], sin[0, :1, 0]))


def _pair_repeated_tables(dtype):
    """Wan's tables: (1, S, 1, D), each angle's cos and sin repeated for its pair."""
    theta = _angles()[None, :, None, :].repeat_interleave(2, dim=-1)
    return theta.cos().to(dtype), theta.sin().to(dtype)


def _rope_cache(dtype):
    """torchtune's cache: (S, D/2, 2) of (cos, sin), viewed by the function as (-1, S, 1, D/2, 2)."""
    cos, sin = _half_tables(torch.float32)
    return (torch.stack([cos, sin], dim=-1)[0, :, 0],)


def _angle_table(dtype):
    return (_angles()[None, :, None, :].to(dtype),)


#: name -> (source, tables, mode, its mutants: wrong sign, wrong pairing, wrong repeat)
CASES = {
    "rope_complex": (
        SOURCE,
        _complex_tables,
        "interleave",
        {
            "sign": ("_npu_sin = freqs_cis.imag", "_npu_sin = -freqs_cis.imag"),
            "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
            "repeat": (".real.repeat_interleave(2, dim=-1)", ".real.tile((2,))"),
        },
    ),
    "rope_matrix": (
        SOURCE,
        _matrix_tables,
        "interleave",
        {
            "sign": ("torch.stack((-rot[..., 1][..., 0]", "torch.stack((rot[..., 1][..., 0]"),
            "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
            "repeat": ("dim=-1).flatten(-2)\n", "dim=-2).flatten(-2)\n"),
        },
    ),
    "rope_pairs": (
        SOURCE,
        _pair_tables,
        "interleave",
        {
            "sign": ("_npu_sin = f[..., 1]", "_npu_sin = -f[..., 1]"),
            "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
            "repeat": ("_npu_cos = f[..., 0].repeat_interleave(2, dim=-1)", "_npu_cos = f[..., 0].tile((2,))"),
        },
    ),
    "rope_halves_opposite_sign": (
        SOURCE,
        _half_tables,
        "half",
        {
            "sign": ("_npu_sin = -sin.tile((2,))", "_npu_sin = sin.tile((2,))"),
            "pairing": ('rotary_mode="half"', 'rotary_mode="interleave"'),
            "repeat": ("_npu_cos = cos.tile((2,))", "_npu_cos = cos.repeat_interleave(2, dim=-1)"),
        },
    ),
    "rope_einops": (
        SOURCE,
        _full_tables,
        "half",
        {
            "sign": ("_npu_rotary_mul(x, cos, sin,", "_npu_rotary_mul(x, cos, -sin,"),
            "pairing": ('rotary_mode="half")\n    x1', 'rotary_mode="interleave")\n    x1'),
            "repeat": ("_npu_rotary_mul(x, cos, sin,", "_npu_rotary_mul(x, cos.flip(-1), sin.flip(-1),"),
        },
    ),
    "rope_written_into": (
        SOURCE,
        _pair_repeated_tables,
        "interleave",
        {
            "sign": ("_npu_sin = freqs_sin[..., 1::2]", "_npu_sin = -freqs_sin[..., 1::2]"),
            "pairing": ('rotary_mode="interleave")\n    x1', 'rotary_mode="half")\n    x1'),
            "repeat": ("freqs_cos[..., 0::2].repeat_interleave(2, dim=-1)", "freqs_cos[..., 0::2].tile((2,))"),
        },
    ),
    "rope_unflatten": (
        SOURCE,
        _full_tables,
        "half",
        {
            "sign": ("_npu_rotary_mul(x, cos, sin,", "_npu_rotary_mul(x, cos, -sin,"),
            "pairing": ('rotary_mode="half")\n    x1', 'rotary_mode="interleave")\n    x1'),
            "repeat": ("_npu_rotary_mul(x, cos, sin,", "_npu_rotary_mul(x, cos.flip(-1), sin.flip(-1),"),
        },
    ),
    "rope_shape_unpacked": (
        SOURCE,
        _flat_tables,
        "half",
        {
            "sign": ("_npu_rotary_mul(x, _npu_cos, _npu_sin,", "_npu_rotary_mul(x, _npu_cos, -_npu_sin,"),
            "pairing": ('_npu_sin, rotary_mode="half")\n    x1', '_npu_sin, rotary_mode="interleave")\n    x1'),
            "repeat": (
                "_npu_rotary_mul(x, _npu_cos, _npu_sin,",
                "_npu_rotary_mul(x, _npu_cos.flip(-1), _npu_sin.flip(-1),",
            ),
        },
    ),
    "rope_nested": (
        SOURCE,
        _full_tables,
        "half",
        {
            "sign": ("_npu_rotary_mul(x, cos, sin,", "_npu_rotary_mul(x, cos, -sin,"),
            "pairing": ('rotary_mode="half")\n    def', 'rotary_mode="interleave")\n    def'),
            "repeat": ("_npu_rotary_mul(x, cos, sin,", "_npu_rotary_mul(x, cos.flip(-1), sin.flip(-1),"),
        },
    ),
    "rope_written_here": (
        NEW_SPELLING,
        _angle_table,
        "interleave",
        {
            "sign": ("_npu_sin = freqs.sin()", "_npu_sin = -freqs.sin()"),
            "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
            "repeat": ("torch.repeat_interleave(freqs.cos(), 2, dim=-1)", "freqs.cos().tile((2,))"),
        },
    ),
}


#: torchtune's spelling, in a fixture the matcher was not written for (it declined it before the evaluator).
CASES["rotate_real_pairs"] = (
    (FIXTURES / "rules" / "NPU703" / "real_pairs.in.py").read_text(encoding="utf-8"),
    _rope_cache,
    "interleave",
    {
        "sign": ("_npu_sin = _npu_t0[..., 1]", "_npu_sin = -_npu_t0[..., 1]"),
        "pairing": ('rotary_mode="interleave").type_as(x)\n    xshaped', 'rotary_mode="half").type_as(x)\n    xshaped'),
        "repeat": ("_npu_cos = _npu_t0[..., 0].repeat_interleave(2, dim=-1)", "_npu_cos = _npu_t0[..., 0].tile((2,))"),
    },
)


#: diffusers' Z-image (`ZSingleStreamAttnProcessor`): the complex rotation inside an autocast-disabled block,
#: which only means the ops run in the dtypes the code gives them; the branch goes first inside the block.
AUTOCAST_OFF = textwrap.dedent(
    """
    import torch


    def rope_autocast_off(x, freqs_cis):
        with torch.amp.autocast("cuda", enabled=False):
            xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            freqs_cis = freqs_cis.unsqueeze(2)
            out = torch.view_as_real(xc * freqs_cis).flatten(3)
            return out.type_as(x)
    """
)


def _batch_complex_tables(dtype):
    """Z-image's freqs_cis: (1, S, D/2), unsqueezed to the heads by the function (a per-batch table is one
    the interleaved kernel does not take: `_npu_rotary_fits` falls back)."""
    return (_complex_tables(dtype)[0][:, :, 0],)


CASES["rope_autocast_off"] = (
    AUTOCAST_OFF,
    _batch_complex_tables,
    "interleave",
    {
        "sign": ("_npu_sin = _npu_t0.imag", "_npu_sin = -_npu_t0.imag"),
        "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
        "repeat": ("_npu_t0.real.repeat_interleave(2, dim=-1)", "_npu_t0.real.tile((2,))"),
    },
)


#: ChatGLM's partial rotary (Kolors' text encoder), written in test_rotary_window (which checks its branch's
#: text without torch): the rotated width read from the table's shape.
WINDOW = test_rotary_window.WINDOW


def _window_cache(dtype, pairs=D // 4):
    """x read as SBND (S=2, B=5, N=3, D=16): a (positions, 1, pairs, 2) cache of (cos, sin), a quarter of
    the head rotated (the kernel's SBND table, S11D)."""
    theta = (torch.rand(B + 1, 1, pairs, generator=torch.Generator().manual_seed(4)) * 2 - 1) * math.pi
    return (torch.stack((theta.cos(), theta.sin()), dim=-1).to(dtype),)


CASES["rope_window_from_table"] = (
    WINDOW,
    _window_cache,
    "interleave",
    {
        "sign": ("_npu_sin = _npu_t0[..., 1]", "_npu_sin = -_npu_t0[..., 1]"),
        "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
        "repeat": ("_npu_cos = _npu_t0[..., 0].repeat_interleave(2, dim=-1)", "_npu_cos = _npu_t0[..., 0].tile((2,))"),
    },
)


#: diffusers' `apply_rotary_emb` shape, written here: a flag with a default chooses real tables or complex
#: numbers, another the pairing (pairs or halves), a third value raises. Each way gets its own branch under
#: its tests (`parameter_paths`); the case name's suffix picks the way by the arguments passed.
BY_FLAG = textwrap.dedent(
    """
    import torch


    def rope_by_flag(x, freqs, use_real=True, pairs_dim=-1):
        if use_real:
            cos, sin = freqs
            if pairs_dim == -1:
                a, b = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
                turned = torch.stack([-b, a], dim=-1).flatten(3)
            elif pairs_dim == -2:
                a, b = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
                turned = torch.cat([-b, a], dim=-1)
            else:
                raise ValueError(pairs_dim)
            return (x.float() * cos + turned.float() * sin).to(x.dtype)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(3).type_as(x)
    """
)

CASES["rope_by_flag[pairs]"] = (
    BY_FLAG,
    lambda dtype: (_pair_repeated_tables(torch.float32), True, -1),
    "interleave",
    {
        "sign": ("_npu_x0, freqs[0], freqs[1], rotary_mode", "_npu_x0, freqs[0], -freqs[1], rotary_mode"),
        "pairing": ('freqs[1], rotary_mode="interleave"', 'freqs[1], rotary_mode="half"'),
        "repeat": (
            "_npu_x0, freqs[0], freqs[1], rotary_mode",
            "_npu_x0, freqs[0][..., ::2].tile((2,)), freqs[1][..., ::2].tile((2,)), rotary_mode",
        ),
    },
)
CASES["rope_by_flag[halves]"] = (
    BY_FLAG,
    lambda dtype: (_full_tables(torch.float32), True, -2),
    "half",
    {
        "sign": ('freqs[0], freqs[1], rotary_mode="half"', 'freqs[0], -freqs[1], rotary_mode="half"'),
        "pairing": ('freqs[1], rotary_mode="half"', 'freqs[1], rotary_mode="interleave"'),
        "repeat": (
            'freqs[0], freqs[1], rotary_mode="half"',
            'freqs[0][..., :8].repeat_interleave(2, -1), freqs[1][..., :8].repeat_interleave(2, -1), rotary_mode="half"',
        ),
    },
)
CASES["rope_by_flag[complex]"] = (
    BY_FLAG,
    lambda dtype: (*_complex_tables(dtype), False),
    "interleave",
    {
        "sign": ("_npu_sin = freqs.imag", "_npu_sin = -freqs.imag"),
        "pairing": ('_npu_sin, rotary_mode="interleave"', '_npu_sin, rotary_mode="half"'),
        "repeat": (".real.repeat_interleave(2, dim=-1)", ".real.tile((2,))"),
    },
)


#: Sana-WM's layout, written here: x is (batch, heads, dim, seq), the pairs run along dim 2, moved last for
#: the complex product and back after it. The kernel gets x moved, its result is moved back.
MOVED = textwrap.dedent(
    """
    import torch


    def rope_moved(x, freqs_cis):
        pairs = x.transpose(2, 3).float().reshape(*x.shape[:2], x.shape[3], -1, 2)
        out = torch.view_as_real(torch.view_as_complex(pairs) * freqs_cis).flatten(3)
        return out.transpose(2, 3).type_as(x)
    """
)

CASES["rope_moved"] = (
    MOVED,
    lambda dtype: (_complex_tables(dtype)[0].transpose(1, 2),),  # (1, 1, S, D/2): BNSD's 11SD once moved
    "interleave",
    {
        "sign": ("_npu_sin = freqs_cis.imag", "_npu_sin = -freqs_cis.imag"),
        "pairing": ('rotary_mode="interleave"', 'rotary_mode="half"'),
        "repeat": (".real.repeat_interleave(2, dim=-1)", ".real.tile((2,))"),
    },
)

#: The case's x from the (B, S, H, D) one the other cases take, where its function wants another layout.
X_LAYOUT = {"rope_moved": lambda x: x.permute(0, 2, 3, 1)}  # (B, H, D, S)


def _migrated(source: str) -> tuple[str, list]:
    return migrate_text(source, path="rope.py", select=["NPU703"])


def _namespace(text: str, *, forced: bool, mutate=None) -> dict:
    if mutate is not None:
        old, new = mutate
        assert old in text, f"mutant {old!r} does not apply"
        text = text.replace(old, new)
    namespace = {"__name__": "rope"}
    exec(compile(text, "rope.py", "exec"), namespace)
    if forced:
        namespace["_is_npu"] = lambda x: True
        namespace["torch_npu"] = TORCH_NPU
    return namespace


def _cosine(a, b) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _run(name, dtype, mutate=None):
    """(cosine of the forced branch vs the original, kernel calls, fallback bit-identical)."""
    source, tables, _, _ = CASES[name]
    text, _ = _migrated(source)
    args = (X_LAYOUT.get(name, lambda x: x)(_x(dtype)), *tables(dtype))
    name = name.split("[")[0]  # `rope_by_flag[halves]`: the function, and the way its arguments choose
    expected = _namespace(source, forced=False)[name](*args)
    before = TORCH_NPU.calls["npu_rotary_mul"]
    got = _namespace(text, forced=True, mutate=mutate)[name](*args)
    calls = TORCH_NPU.calls["npu_rotary_mul"] - before
    kept = _namespace(text, forced=False)[name](*args)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return _cosine(got, expected), calls, torch.equal(kept, expected)


@pytest.mark.parametrize("name", CASES)
def test_each_spelling_gets_a_branch_in_its_mode(name):
    source, _, mode, _ = CASES[name]
    text, findings = _migrated(source)
    ours = [f for f in findings if f.rule_id == "NPU703" and f.fixed and "branch" in f.message]
    function = text.split(f"def {name.split('[')[0]}(", 1)[1].split("\ndef ", 1)[0]
    assert f'rotary_mode="{mode}"' in function, function
    assert "_is_npu(x)" in function
    assert ours, [f.message for f in findings]
    again, _ = _migrated(text)
    assert again == text, "a second apply must change nothing"


@pytest.mark.parametrize("dtype, floor", [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", CASES)
def test_branch_agrees_with_the_original_and_the_fallback_is_untouched(name, dtype, floor):
    cosine, calls, kept = _run(name, dtype)
    assert calls == 1
    assert cosine >= floor, cosine
    assert kept


@pytest.mark.parametrize("broken", ["sign", "pairing", "repeat"])
@pytest.mark.parametrize("name", CASES)
def test_a_broken_rewrite_fails_the_check(name, broken):
    mutate = CASES[name][3][broken]
    cosine, calls, _ = _run(name, torch.float32, mutate=mutate)
    assert calls == 1
    assert cosine < 0.999, (name, broken, cosine)


def test_a_spelling_written_for_this_test_is_recognised_without_code_changes():
    text, findings = _migrated(NEW_SPELLING)
    assert 'rotary_mode="interleave"' in text, [f.message for f in findings]
    cosine, calls, kept = _run("rope_written_here", torch.float32)
    assert calls == 1 and cosine >= 0.999 and kept


NEAR_MISSES = {
    # the first half of the rotation scaled by 2, the second not: no kernel table computes that
    "scaled": (
        "def rope(x, cos, sin):\n    x1, x2 = x.chunk(2, dim=-1)\n    return x * cos + torch.cat((-2 * x2, x1), -1) * sin\n",
        "scaled by 2",
    ),
    # element j paired with D-1-j (a flip), which neither mode does
    "another pairing": (
        "def rope(x, cos, sin):\n    return x * cos + x.flip(-1) * sin\n",
        "neither rotation pairs it with",
    ),
    # halves of a literal width: a rotation at head dim 8 only (the evaluator runs two head dims)
    "fixed width": (
        "def rope(x, cos, sin):\n    x1, x2 = x[..., :4], x[..., 4:]\n    return x * cos + torch.cat((-x2, x1), -1) * sin\n",
        "neither rotation pairs it with",
    ),
    # 3-D activations [B, S, D] rotated over the whole last dim (LTX): no 4-D head dim to give the kernel
    "3-D activations": (
        "def rope(x, cos, sin):\n    a, b = x.unflatten(2, (-1, 2)).unbind(-1)\n"
        "    return x * cos + torch.stack((-b, a), -1).flatten(2) * sin\n",
        "it names the dims it splits and joins from the front (`.unflatten(2, (-1, 2))`, `.flatten(2)`), so the dim "
        "it rotates is the last one only of a 3-D tensor",
    ),
    # torchtune's vision rotary, written here: the sequence split into tiles of a size only the config
    # knows, the table per position within a tile; read where that size is 1, and declined
    "tiles of the sequence": (
        "def rope(x, cache, cfg):\n    b, s, h, d = x.shape\n"
        "    xs = x.float().reshape(b, cfg.tiles, -1, h, d // 2, 2)\n"
        "    c = cache.view(1, 1, xs.size(2), 1, d // 2, 2)\n    cos, sin = c[..., 0], c[..., 1]\n"
        "    out = torch.stack([xs[..., 0] * cos - xs[..., 1] * sin, xs[..., 1] * cos + xs[..., 0] * sin], -1)\n"
        "    return out.reshape(b, s, h, d).type_as(x)\n",
        "x is viewed with sizes read from `cfg.tiles`, which are not known here",
    ),
    # the second half not rotated
    "partly rotated": (
        "def rope(x, cos, sin):\n    x1, x2 = x.chunk(2, dim=-1)\n    return x * cos + torch.cat((-x2, x1 * 0), -1) * sin\n",
        "not rotated",
    ),
}


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_close_but_not_equal_is_declined_with_what_differs(name):
    body, reason = NEAR_MISSES[name]
    source = "import torch\n\n\n" + body
    text, findings = _migrated(source)
    assert text == source
    messages = [f.message for f in findings if f.rule_id == "NPU703"]
    assert messages and all(not f.fixed for f in findings), messages
    if reason is not None:
        assert any(reason in m for m in messages), messages


def test_interleaved_spellings_are_declined_where_the_version_has_no_rotary_mode():
    text, findings = migrate_text(SOURCE, path="rope.py", select=["NPU703"], torch_npu_version="2.1.0.post8")
    messages = [f.message for f in findings if f.rule_id == "NPU703"]
    assert sum("has no rotary_mode='interleave'" in m for m in messages) == 4, messages
    # ... and says what would let it apply (issue #25: a decline says what to do)
    assert sum("; to fuse it, target a torch_npu that has it" in m for m in messages) == 4, messages
    assert 'rotary_mode="interleave"' not in text
    assert text.count('rotary_mode="half")') == 5  # the half-mode spellings still fused


def test_the_autocast_disabled_branch_runs_inside_the_block():
    text, _ = _migrated(AUTOCAST_OFF)
    block = text.split('with torch.amp.autocast("cuda", enabled=False):\n', 1)[1]
    # first in the block, one level in (a complex table's dtype is checked too: the head spans lines)
    assert re.match(r"        if \(?\s*_is_npu\(x\)", block), block
    # the deprecated spelling too
    old = AUTOCAST_OFF.replace('torch.amp.autocast("cuda", enabled=False)', "torch.cuda.amp.autocast(enabled=False)")
    text, _ = _migrated(old)
    assert re.match(r"        if \(?\s*_is_npu\(x\)", text.split("torch.cuda.amp.autocast(enabled=False):\n", 1)[1]), (
        text
    )


@pytest.mark.parametrize(
    "context",
    [
        'torch.amp.autocast("cuda", enabled=True)',  # autocast on: the ops run in its dtype, not the code's
        'torch.amp.autocast("cuda")',
        "torch.no_grad()",  # anything else in a `with` is not read through
        'torch.amp.autocast("cuda", enabled=False) as ctx',
        'torch.amp.autocast("cuda", enabled=off)',  # not known to be False
    ],
)
def test_any_other_with_is_left_alone(context):
    source = AUTOCAST_OFF.replace('torch.amp.autocast("cuda", enabled=False)', context)
    text, findings = _migrated(source)
    assert text == source, context
    assert not any(f.fixed for f in findings)
    # declined, not silent, with what to do
    messages = [f.message for f in findings if f.rule_id == "NPU703"]
    assert any("inside `with " in m and "; to fuse it, rotate in a function of its own" in m for m in messages), (
        messages
    )


def test_a_rotated_width_read_from_the_table_is_checked_to_be_the_windows():
    """The evaluator takes `cache.shape[-2] * 2` to be the width of `x[..., :n]`; the branch checks that
    first. A cache wider than the head makes the original fail, and the migrated code the same way."""
    text, _ = _migrated(WINDOW)
    assert "if _is_npu(x) and 0 <= cache.shape[-2] * 2 <= x.shape[-1]:" in text, text
    x, (wide,) = _x(torch.float32), _window_cache(torch.float32, pairs=D // 2 + 2)
    errors = []
    for namespace in (_namespace(WINDOW, forced=False), _namespace(text, forced=True)):
        with pytest.raises(RuntimeError) as error:
            namespace["rope_window_from_table"](x, wide)
        errors.append(str(error.value))
    assert errors[0] == errors[1]


def test_each_way_through_the_flags_falls_back_to_the_original_where_its_kernel_does_not_apply():
    """The ways' tests exclude each other: where the chosen way's kernel does not apply (tables of another
    dtype than the upcast x), no other way's branch runs instead, and the original gives its own bits; a
    value the original raises on raises the same."""
    text, _ = _migrated(BY_FLAG)
    migrated = _namespace(text, forced=True)["rope_by_flag"]
    original = _namespace(BY_FLAG, forced=False)["rope_by_flag"]
    x = _x(torch.float32)
    for tables, pairs_dim in ((_pair_repeated_tables(torch.float64), -1), (_full_tables(torch.float64), -2)):
        before = TORCH_NPU.calls["npu_rotary_mul"]
        got = migrated(x, tables, True, pairs_dim)
        assert TORCH_NPU.calls["npu_rotary_mul"] == before
        assert torch.equal(got, original(x, tables, True, pairs_dim))
    with pytest.raises(ValueError, match="^0$"):
        migrated(x, _full_tables(torch.float32), True, 0)


FLAG_NEAR_MISSES = {
    # the flag is rebound in the body: the branch could not test what the original's `if` tests
    "rebound": (
        "def rope(x, cos, sin, on=True):\n    on = not on\n    if on:\n"
        "        x1, x2 = x.chunk(2, dim=-1)\n        y = x * cos + torch.cat((-x2, x1), -1) * sin\n"
        "    else:\n        y = x\n    return y\n",
        None,
    ),
    # one way scales the rotated half: that way is declined with what differs, the other fused
    "one way scaled": (
        "def rope(x, cos, sin, twice=False):\n    x1, x2 = x.chunk(2, dim=-1)\n    if twice:\n"
        "        return x * cos + torch.cat((-2 * x2, x1), -1) * sin\n"
        "    return x * cos + torch.cat((-x2, x1), -1) * sin\n",
        "(1 of 2 ways, rotary_mode 'half'); not where `twice`: rotary embedding not fused: the rotation is scaled by 2",
    ),
}


@pytest.mark.parametrize("name", FLAG_NEAR_MISSES)
def test_a_way_that_cannot_be_proven_is_not_fused_and_a_declined_way_is_said_so(name):
    body, reason = FLAG_NEAR_MISSES[name]
    source = "import torch\n\n\n" + body
    _, findings = _migrated(source)
    messages = [f.message for f in findings if f.rule_id == "NPU703"]
    assert reason is None or any(reason in m for m in messages), messages
    if name == "rebound":
        assert not any(f.fixed for f in findings)
        # not rebound, the same function is fused on the way that rotates
        text, _ = _migrated(source.replace("    on = not on\n", ""))
        assert "    if _is_npu(x):\n        if on and " in text, text


OR_TEST = textwrap.dedent(
    """
    import torch


    def rope_either(x, cos, sin, a=1, b=None):
        if a == 2 or b is not None:
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(3)
        return x * cos + turned * sin
    """
)


def test_a_way_whose_test_is_an_or_keeps_it_whole():
    """Each way's tests are joined by `and` with the kernel's checks: an `or` keeps its parentheses, and
    the way that takes it runs its own kernel, the other way the other (one call each)."""
    text, _ = _migrated(OR_TEST)
    assert "            (a == 2 or b is not None)\n            and _npu_rotary_fits(" in text, text
    migrated = _namespace(text, forced=True)["rope_either"]
    original = _namespace(OR_TEST, forced=False)["rope_either"]
    x, cos, sin = _x(torch.float32), *_full_tables(torch.float32)
    for a, b, mode in ((2, None, "half"), (1, 0, "half"), (1, None, "interleave")):
        before = TORCH_NPU.calls["npu_rotary_mul"]
        got = migrated(x, cos, sin, a, b)
        assert TORCH_NPU.calls["npu_rotary_mul"] == before + 1, (a, b)
        assert _cosine(got, original(x, cos, sin, a, b)) >= 0.999, (a, b, mode)
    # the sides swapped in the branch: fails
    swapped = text.replace("    (a == 2", "    @").replace("not (a == 2", "(a == 2").replace("    @", "    not (a == 2")
    broken = _namespace(swapped, forced=True)
    assert _cosine(broken["rope_either"](x, cos, sin, 2, None), original(x, cos, sin, 2, None)) < 0.999
