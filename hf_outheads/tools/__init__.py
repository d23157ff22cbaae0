"""The installed package's tools: what only `pip install hf_outheads` runs, never a saved model's
remote code. Conversion of a transformers model (`conversion`), the plain export (`export_plain`),
model cards (`model_card`), the folders a save or a command writes (`folders`), analytic FLOPs
(`flops`), perplexity by frequency band (`frequency_bands`), the Triton kernels of the fused
losses (`softmax_kernels`), and the `hf-outheads` command (`cli`, with `serve`).

They import the runtime (the modules of `hf_outheads/`); the runtime reaches them at call time
through `hf_outheads.model_io.package_tool` alone, never by an import statement, so transformers
copies none of them into a saved folder.
"""
