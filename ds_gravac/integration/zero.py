"""ZeRO stages 1 and 2: ds_gravac carries out the gradient exchange, the ZeRO optimizer keeps everything else.

DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer`` (``runtime/zero/stage_1_and_2.py``) reduces gradients in two places:
per-parameter gradient hooks (stage 2, and stage 1 with ``overlap_comm`` or ``contiguous_gradients``) that bucket
and reduce-scatter each gradient as backward produces it, and the engine's backward epilogue
(``allreduce_gradients``: stage 1 ``reduce_gradients()``, stage 2 the epilogue of the hooks). Both end in the same
place: ``optimizer.averaged_gradients[g]``, this rank's partition of group ``g``'s averaged gradient as a list of
flat pieces, which ``optimizer.step()`` turns into the fp32 gradient of its partitioned master weights (overflow
check, norm, clipping, unscaling, the update, the parameter all-gather).

The takeover:

* the engine's ``enable_backward_allreduce`` is off (as with ZeRO-0), so the epilogue reduces nothing;
* the optimizer's own gradient hooks are removed (``detach`` registers them again), so nothing is reduced during
  backward either; ``p.grad`` accumulates over micro-batches as with ZeRO-0;
* at the boundary, ds_gravac's hooks and end-of-backward callback average the gradients (dense, compressed, with
  error feedback) into ``p.grad`` exactly as with ZeRO-0, then :meth:`ZeroBridge.fill_partitions` hands the
  optimizer this rank's partition through the optimizer's own partition builder, and releases the gradients of
  parameters this rank does not own (stage 2: ZeRO frees them too).

Refused (clear message at attach): stage 3 (parameters are partitioned: a rank never holds a whole gradient),
optimizer/parameter offload, ZeRO++ (quantized weights/gradients, hierarchical partitions), and a gradient
accumulation dtype different from the model's (the optimizer then accumulates in a side buffer ds_gravac cannot
see at the boundary; stage 1 + bf16 + fp32 accumulation is DeepSpeed's separate ``BF16_Optimizer``).
"""
from __future__ import annotations

from typing import Any

from ..errors import unsupported


def zero_stage(engine: Any) -> int:
    stage = getattr(engine, "zero_optimization_stage", None)
    return int(stage()) if callable(stage) else 0


def validate_zero(engine: Any) -> None:
    """Raise naming the first ZeRO setting ds_gravac cannot take over (stage 0 passes untouched)."""
    stage = zero_stage(engine)
    if stage == 0:
        return
    if stage >= 3:
        unsupported(f"zero_optimization.stage {stage} is not supported (allowed: 0, 1, 2): stage 3 partitions the "
                    f"parameters, so no rank holds a whole gradient to compress; use stage 1 or 2, or leave the "
                    f"\"gravac\" section out to train with DeepSpeed alone")
    zc = engine._config.zero_config
    if zc.offload_optimizer is not None and str(getattr(zc.offload_optimizer.device, "value",
                                                        zc.offload_optimizer.device)) != "none":
        unsupported("zero_optimization.offload_optimizer is not supported: the offloaded optimizer copies gradients "
                    "to the host inside its own reduction; remove the key")
    if zc.offload_param is not None and str(getattr(zc.offload_param.device, "value",
                                                    zc.offload_param.device)) != "none":
        unsupported("zero_optimization.offload_param is not supported (a stage 3 feature); remove the key")
    if zc.zero_quantized_weights or zc.zero_quantized_gradients or int(zc.zero_hpz_partition_size or 1) > 1:
        unsupported("ZeRO++ (zero_quantized_weights, zero_quantized_gradients, zero_hpz_partition_size > 1) is not "
                    "supported: it replaces the gradient exchange ds_gravac takes over; remove those keys")
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    opt = engine.optimizer
    if (isinstance(opt, BF16_Optimizer) or getattr(opt, "use_grad_accum_attribute", False)
            or getattr(opt, "gradient_accumulation_dtype", None) not in (None, getattr(opt, "dtype", None))):
        unsupported("data_types.grad_accum_dtype different from the model dtype is not supported with ZeRO: the "
                    "optimizer then accumulates gradients in a side buffer that ds_gravac cannot average at the "
                    "boundary; remove data_types.grad_accum_dtype (gradients accumulate in the model dtype)")
    for attr in ("averaged_gradients", "params_in_partition", "params_not_in_partition", "first_offset",
                 "partition_size", "get_flat_partition", "get_all_grad_tensors", "_grad_acc_hooks"):
        if not hasattr(opt, attr):
            unsupported(f"ZeRO stage {stage}: the optimizer {type(opt).__name__} lacks '{attr}' (ds_gravac supports "
                        f"DeepSpeed 0.19.8's DeepSpeedZeroOptimizer)")


class ZeroBridge:
    """Owns the hand-over between ds_gravac's averaged ``p.grad`` and one ZeRO-1/2 optimizer's partitions."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.opt = engine.optimizer
        self.stage = zero_stage(engine)
        self.had_hooks = False

    def install(self) -> None:
        """Remove the optimizer's gradient hooks: it reduces nothing during backward while we are attached."""
        self.had_hooks = bool(self.opt._grad_acc_hooks)
        for handle in self.opt._grad_acc_hooks:
            handle.remove()
        self.opt._grad_acc_hooks = []

    def loss_scale(self) -> float:
        """The scale the loss was multiplied by for this backward (fp16 dynamic scaling; 1 otherwise)."""
        return float(getattr(self.opt, "loss_scale", 1.0) or 1.0)

    def fill_partitions(self) -> None:
        """``p.grad`` holds the averaged gradient of every parameter: give the optimizer its partitions, built
        by its own partition builder (so padding, offsets and the norm's bookkeeping are ZeRO's), and release
        the gradients of parameters this rank does not update."""
        opt = self.opt
        dtype = opt.gradient_accumulation_dtype
        for i in range(len(opt.bit16_groups)):
            params = opt.params_in_partition[i]
            device = params[0].device if params else opt.bit16_groups[i][0].device
            opt.all_grad_tensors[i] = opt.get_all_grad_tensors(params, dtype=dtype)
            opt.averaged_gradients[i] = opt.get_flat_partition(params, opt.first_offset[i], opt.partition_size[i],
                                                               dtype=dtype, device=device, param_group_idx=i,
                                                               return_tensor_list=True)
            opt.all_grad_tensors[i] = None
            if self.stage == 2:
                for p in opt.params_not_in_partition[i]:
                    p.grad = None

    def close(self) -> None:
        """Give the optimizer its gradient hooks back (``detach``)."""
        if self.had_hooks and not self.opt._grad_acc_hooks:
            self.opt.create_gradient_handling_hooks()

