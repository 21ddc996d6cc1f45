"""The training loss heads, applied from outside the model (knob `loss`); `choose.loss_fn` picks one.

- standard, inline (`standard`): the model's own forward, logits then cross-entropy. standard returns the logits
  with the loss, as the public recipe (nanoGPT) does; inline returns only the loss, so under torch.compile the
  logits are no output of the graph and the compiler may fuse the cross-entropy into the output layer.
- chunked (`chunked`): the body, then the output layer and cross-entropy a chunk of tokens at a time, each chunk's
  gradients made in forward, so only one chunk's logits ever live.
- fused, cce (`library`): the body, then liger-kernel's or cut-cross-entropy's fused linear + cross-entropy
  kernel, which never materializes the logits.
- onepass (`onepass`): the output layer and its cross-entropy as one custom op inside the compiled graph.

`shared` holds what several heads use; a head module imports it and no other head's module. This file stays
inert: a stage imports the modules it needs by name, and dvc.yaml lists those.
"""
