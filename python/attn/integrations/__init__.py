"""attn.integrations — attn inside other frameworks (each module imports its framework).

- attn.integrations.torch_op: the PyTorch custom operators torch.ops.attn.sdpa and
  torch.ops.attn.sdpa_backward (torch.library), differentiable, with fake (meta)
  implementations, so torch.compile(fullgraph=True) and torch.export keep them.
- attn.integrations.transformers: the Hugging Face transformers attention backend
  "attn" (attn_implementation="attn"), registered on import.

Nothing here is imported by `import attn`.
"""
