"""What vLLM's own loader reads from a model folder, run on a node with the node's
virtualenv Python (bench/bench_model.py sends it over SSH):

    /opt/vllm-cluster/venv/bin/python - DIR <loader_reads.py

Prints JSON: the weight files DefaultModelLoader._prepare_weights picks in DIR (vLLM
0.32 model_executor/model_loader/default_loader.py:147-263: the *.safetensors there,
less those the folder's index does not name), their bytes, and the bytes of the
tensors safetensors_weights_iterator yields from them. Every worker iterates over every
one of these files whatever its pipeline stage (scripts/lib/model_stage.py, the facts),
so the files' bytes are what each node reads from DIR, once into its page cache.
"""

import json
import os
import sys

from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator


def main() -> None:
    folder = sys.argv[1]
    loader = DefaultModelLoader(LoadConfig(load_format="safetensors"))
    _folder, files, _safetensors, _index = loader._prepare_weights(folder, None, None, False, None)
    tensor_bytes = sum(tensor.nbytes for _name, tensor in safetensors_weights_iterator(sorted(files), False))
    print(
        json.dumps(
            {
                "folder": folder,
                "files": sorted(os.path.basename(name) for name in files),
                "file_bytes": sum(os.path.getsize(name) for name in files),
                "tensor_bytes": tensor_bytes,
            }
        )
    )


if __name__ == "__main__":
    main()
