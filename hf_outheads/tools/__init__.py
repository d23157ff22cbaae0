"""The installed package's tools: what only `pip install hf_outheads` runs, never a saved model's
remote code, and none of it needs the training stack.

- the services the runtime defers to: conversion of a transformers model (`conversion`), the plain
  export (`export_plain`), model cards (`model_card`, its template `model_card.md`), the folders a
  save or a command writes (`folders`), and the Triton kernels of the fused losses
  (`softmax_kernels`; the runtime's `loss_kernels` chooses among them and the peers' kernels);
- the commands: `hf-outheads` (`cli`), and those of it that need no training stack: `export`,
  `gguf` (`gguf_convert`) and `serve`, with what they share: the command-line rules
  (`command_line`) and a model folder's tokenizer (`saved_tokenizer`);
- the vLLM plugin (`vllm_plugin`), which vLLM loads through the package's `vllm.general_plugins`
  entry point: vLLM's backbone of the family with the package's head.

They import the runtime (the modules of `hf_outheads/`); the runtime reaches them at call time
through `hf_outheads.model_io.package_tool` alone, never by an import statement, so transformers
copies none of them into a saved folder.
"""
