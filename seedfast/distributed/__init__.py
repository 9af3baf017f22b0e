"""Scale-out on PyTorch's own engines: the mesh from torchrun, tensor parallel and FSDP2, the vocabulary-parallel
LM head, DCP checkpoints, the memory plan, and the weights gathered for a colocated vLLM (docs/scaling.md). Named
`distributed`, not `dist`: Python's packaging writes its build output to dist/, which common .gitignore templates
drop."""
