import torch

from seedfast.runtime.optim import adamw


def test_the_fused_adamw_takes_the_same_steps_as_the_default_one():
    torch.manual_seed(0)
    start = [torch.randn(64, 32), torch.randn(32)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(3)]
    runs = []
    for make in (lambda ps: adamw(ps, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8),
                 lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8)):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        optimizer = make(params)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            optimizer.step()
        runs.append((optimizer, params))
    (fused, a), (_, b) = runs
    assert fused.defaults.get("fused") is True  # this torch has the CPU kernel: the trainer gets it
    for x, y, s in zip(a, b, start):
        assert not torch.equal(x, s)
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_a_device_or_dtype_without_the_fused_kernel_falls_back(monkeypatch):
    real = torch.optim.AdamW

    def no_fused_kernel(params, fused=None, **options):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real(params, **options)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused_kernel)
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = adamw([param], lr=1e-3)
    assert not optimizer.defaults.get("fused")
    param.grad = torch.ones(4)
    optimizer.step()
    assert float(param.detach()[0]) < 0
