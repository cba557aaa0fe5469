"""attn.integrations — attn inside other frameworks (each module imports its framework).

- attn.integrations.torch_op: the PyTorch custom operators torch.ops.attn.sdpa,
  attn.varlen (differentiable), attn.kvcache, attn.merge_attention_states and
  attn.cascade (torch.library), with fake (meta) implementations, so
  torch.compile(fullgraph=True) and torch.export keep them; attn's public calls go
  through them when traced.
- attn.integrations.transformers: the Hugging Face transformers attention backend
  "attn" (attn_implementation="attn"), registered on import.

Nothing here is imported by `import attn` (torch_op is, lazily, by a public call that
receives a torch tensor).
"""
