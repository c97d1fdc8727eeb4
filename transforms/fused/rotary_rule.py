"""NPU703's rule: its id, its documentation, and the templates its branch is written with.

Kept apart from the matching so that every part of NPU703 (`rotary_declines`, `rotary_branch`,
`rotary_outcome`, `rotary_tail`, and `rotary`, the rule's entry) can name the rule it reports for
without importing the entry, which imports them all: no import circle.
"""

from __future__ import annotations

from npu_migrate.engine.rule import EVERY_TARGET, Example, FixSafety, Rule

ROTARY = Rule(
    id="NPU703",
    name="fused-rotary",
    family="fused",
    summary="hand-written rotary embedding (`x * cos + rotate_half(x) * sin`) gets a guarded `torch_npu.npu_rotary_mul` branch",
    what="""
    Recognises a rotary embedding by what it computes, not by how it is written: the function's folded
    expression (helpers inlined: module-level, nested in the body, sibling methods, or imported from a
    sibling module, `from .rope import rotate_half`, read with `ast` and never imported) is run on a small
    symbolic tensor x (`transforms/fused/evaluator.py`), every subexpression that does not read x taken
    as an opaque table, and a subexpression is fused when each element of its result is
    `x[j] * C[j] + x[partner(j)] * sign * S[j]`, `npu_rotary_mul`'s `x * C + rotate(x) * S` in mode
    'half' (`rotate_half`, the halves `cat((-x2, x1))`) or 'interleave' (GPT-J's pairs), sign included,
    at two head dims (`transforms/fused/rotation.py`). Spellings it covers, among others: HF's
    `x * cos + rotate_half(x) * sin` (either operand order, any helper name), `x.chunk(2)` halves, einops
    halves and pairs (`rearrange(x, "... (j d) -> ... j d", j=2).unbind(-2)`, `"... (d r) -> ... d r"`),
    the halves written out (`cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin))`, half-width tables: the
    kernel on `cos.tile((2,))`), the rotation by -theta (`cat((x2, -x1))`, the rotated half subtracted,
    the signs of the halves swapped: the kernel with the sin table negated), interleaved pairs
    (`stack((-x1, x0), -1).flatten(3)`, `x0 * c - x1 * s` per pair: tables repeated per pair,
    `t.repeat_interleave(2, dim=-1)`), complex numbers (`view_as_real(view_as_complex(x.float()...) *
    freqs_cis)`: `freqs_cis.real` / `.imag` repeated per pair, the kernel on `x.float()`), pair tables
    (`f[..., 0]`, `f[..., 1]`), a 2x2 rotation matrix per pair (`rot[..., 0] * xp[..., 0] + rot[..., 1] *
    xp[..., 1]`: the kernel tables stacked per parity, the matrix's trailing shape checked first), tables
    times a scale (`t * freqs.cos() * scale`, checked to be tensors), tables given x's sizes
    (`cache.view(-1, x.size(1), 1, d)`), a shape unpacked with a star (k-diffusion's interleaved
    `*shape, d, r = x.shape; x.view(*shape, d * r)`, where the starred name is only read unpacked),
    partial rotary (the rotated window, the rest passed through;
    ChatGLM's width read from the table, `x[..., :rope_cache.shape[-2] * 2]`, checked first to lie within
    x), a rotation of another dim than the last (Sana-WM's `x.permute(0, 1, 3, 2)` rotated, moved back
    after: the kernel on the moved view), a CUDA-only fast path in front (kept for CUDA, the branch goes first), a body that is one
    `with torch.autocast(..., enabled=False):` (Z-image: the branch goes first inside the block, where
    the kernel runs with autocast disabled as the original's ops do). The kernel tables are built
    once per call, by tensor operations, in the branch. Interleaved rotary maps to
    rotary_mode='interleave' for torch_npu versions that have it. A branch in front of the untouched
    body runs the kernel when the tensors are on an NPU and `_npu_rotary_fits` holds: 4-D x (the rotation is proven on
    one; code naming dims computes something else at a lower rank), one dtype for x, cos and sin, cos/sin broadcasting into x in a layout the kernel accepts (BNSD: 11SD/B1SD/BNSD,
    BSND: 1S1D/BS1D/BSND, SBND: S11D/SB1D/SBND), an even head dim below 896; tables of lower rank (QwenImage's `(S, 1, D/2)`
    complex table) broadcast as with leading 1s, and the kernel gets them so. What the original computes
    once (the unsqueezed tables, an upcast `q.float()`, a cache view both tables slice, a rotated width and
    its window `q[..., :cos.shape[-1]]`) is bound once, in the branch. Tensors rotated with tables of their
    own (a helper called for q and for k that cuts the cache to each one's length, xpos scaling k's tables
    by the inverse of q's scale) are each checked and rotated with their own. When the tables are
    prepared under `if`s or asserts and only the rest of the body is straight-line code, the branch goes
    in front of that rest, reading the values the names hold there (assignments before the `if`s that
    still hold, as litgpt's `rotated`, are read as computed). When
    `if`s on parameters choose the rotation (diffusers' `apply_rotary_emb`: `if use_real:`, `if
    use_real_unbind_dim == -1:`, complex numbers in the `else`), each way through them is read as
    straight-line code and fused on its own, in one branch per way under the tests that select it (tests
    of parameters the body never rebinds, calling nothing; a way that raises gets none).

    Declined, with a finding saying what differs: an element read from a position neither mode pairs it
    with, a term scaled by a constant, a kernel table that would be a sum of tables, a complex table the
    code computes by arithmetic on tables (audiocraft's xPos `rotation * decay * scale + (1 - scale)`:
    scaled and shifted, not a rotation alone, and not checkable as complex before the branch reads it),
    x cast to a dtype read from elsewhere (`x.to(self.dtype)`: read as kept only to say so), elements not
    rotated, a computation that differs at another head dim (a fixed-width slice), interleaved rotary
    where the torch_npu version has no rotary_mode, a rotation under other control flow, rotations with
    different tables in one function where a table's trailing shape must be checked (a rotation matrix per
    pair), 3-D activations [B, S, D] rotated over the whole last dim as one head
    (LTX: the kernel takes 4-D x and a head dim below 896), a view of x by a size read from an attribute
    (torchtune's vision `self.max_num_tiles`: read where it is 1 only), a branch that would call anything but a tensor operation
    (`self.bn(x)`, dropout) before `_npu_rotary_fits` decides, where no later placement avoids it (the
    original calls it again when the kernel does not apply), or that would repeat what the function calls
    on the rotated tensors (`self.out(sdpa(q, k, v))` after `q, k = apply_rotary(...)`: the helper gets
    its own branch). An operation the evaluator does not know is
    never guessed: the function is left alone, and one that multiplies what a `rotate*` helper returns
    gets a finding saying why (the helper imported from a module the tool cannot read, as from stdin, or
    not recognised, or the tensor it rotates computed by a call the evaluator does not model). An imported
    helper is followed next to the file (relative imports through the package, absolute ones from a
    script's folder or the package root), by name (`from .rope import rotate_half`), as a module's
    function (`from . import rope`, `rope.rotate_half(x)`), from imports at the top of the function body
    (the branch goes after them), and one import further (a helper of the sibling calling what its module
    imports); its names are read as its module binds them, and a branch that would need a name this file
    does not bind alike is declined, as is a helper a star import, `global`, a `try` import's fallback or
    a later assignment may rebind. A complex table is checked to be complex before the branch reads its
    imaginary part. A rotation inside a loop, or one that names the dims it splits from the front (the
    last dim of a 3-D x only, where the same code counted from the end is one), is declined with why.
    """,
    why="""
    The hand-written rotation is several operators per tensor (halves, a negation, a concatenation, two
    products and a sum), each a kernel launch and a trip through device memory;
    `torch_npu.npu_rotary_mul` is one kernel.
    """,
    example=Example(
        before="""
            import torch


            def rotate_half(x):
                x1, x2 = x.chunk(2, dim=-1)
                return torch.cat((-x2, x1), dim=-1)


            def apply_rotary(q, cos, sin):
                return q * cos + rotate_half(q) * sin
        """,
        after="""
            import torch


            # ... fused-op helpers npu-migrate adds here: import torch_npu (guarded), _is_npu, _npu_rotary_mul, _npu_rotary_fits


            def rotate_half(x):
                x1, x2 = x.chunk(2, dim=-1)
                return torch.cat((-x2, x1), dim=-1)


            def apply_rotary(q, cos, sin):
                if _is_npu(q) and _npu_rotary_fits(cos, sin, q, mode="half"):
                    return _npu_rotary_mul(q, cos, sin, rotary_mode="half")
                return q * cos + rotate_half(q) * sin
        """,
    ),
    fix_safety=FixSafety.NEEDS_REVIEW,
    review="""
    The fused kernel computes the same function, not the same bits: it rounds differently from the
    operators it replaces (within the dtype's precision). Off an NPU nothing changes, bit for bit.
    Check the migrated model with `npu-migrate verify`, which compares one forward pass of the original
    and the migrated tree.
    """,
    tags=frozenset({"fused"}),
    needs_torch_npu=False,
    targets=EVERY_TARGET,
)

TEMPLATE = "fused/rotary.py.j2"
HELPER = "fused/rotary_fits.py.j2"
