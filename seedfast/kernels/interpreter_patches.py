"""Gaps of Triton's interpreter (TRITON_INTERPRET=1), patched to what the GPU does, for the CPU runs of the kernels
(tests/kernels/conftest.py, benchmarks/kernels.py --dry-run). Nothing here runs on a GPU.

    patch_interpreter()    both of the below
    patch_interpreter_bf16()    bf16 dot and fp32 -> bf16 cast (Triton 3.6-3.9)
    patch_interpreter_index()   a scalar used as an index or range bound (Triton 3.6 under NumPy >= 2.4)
"""


def patch_interpreter() -> None:
    patch_interpreter_bf16()
    patch_interpreter_index()


def patch_interpreter_index() -> None:
    """Triton 3.6's interpreter turns a scalar tensor into an int with int(ndarray), which NumPy 2.4 refuses for the
    1-element arrays it stores scalars in ("only 0-dimensional arrays can be converted to Python scalars"): every
    kernel with `range(start, stop, step)` over a program-dependent bound fails. Triton 3.9 squeezes first; so does
    this. Found by the pre-flight (benchmarks/preflight_image_versions.py): torch 2.11 / Triton 3.6 beside NumPy 2.4."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_seedfast_patched", False):
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0])
                       if self.handle.data.size == 1 else int(self.handle.data))

    patched._seedfast_patched = True
    interpreter._patch_lang_tensor = patched


def patch_interpreter_bf16() -> None:
    """Two bf16 gaps of the interpreter (Triton 3.6-3.9), patched to what the GPU does:
    - bf16 is stored as uint16 and tl.dot multiplied those integers: widen operands to fp32 (exact; the
      GPU multiplies bf16 exactly and accumulates in fp32); fp16 operands likewise (numpy would accumulate
      their products in fp16);
    - fp32 -> bf16 casts truncated: round to nearest even, as the GPU's cvt.rn.bf16.f32."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_seedfast_patched", False):
        return
    dot, cast = builder.create_dot, builder.cast_impl

    def widen(x):
        if x.dtype == tl.bfloat16:
            return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        if x.dtype == tl.float16:
            return interpreter.TensorHandle(x.data.astype(np.float32), tl.float32)
        return x

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(src.data)
            rounded[nan] = 0x7FC0
            return interpreter.TensorHandle(rounded, tl.bfloat16)
        return cast(self, src, dst_type)

    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    builder._seedfast_patched = True
