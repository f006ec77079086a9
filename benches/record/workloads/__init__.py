"""The workloads that record.py records, one trace each.

WORKLOADS is the registry: one row per trace, naming the function that runs
it (`module:function` in this package; the module is imported only when the
workload runs, so listing needs neither PyTorch nor CuPy). A function takes
a `Context` (context.py) and runs the whole workload; what it allocates on
the GPU is the trace.

`held_out` marks the traces never to be used to tune memres's defaults
(the pool's growth, binning, ...): they are kept to test that a tuning
carries over to workloads it was not fitted to. About a third, spread over
the kinds.
"""

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    target: str  # "module:function" in this package
    framework: str  # "torch" or "cupy" (CuPy workloads run on NumPy in a CPU dry run)
    kind: str
    held_out: bool
    about: str

    def function(self):
        module, function = self.target.split(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)


WORKLOADS = [
    Workload("infer_bert_dynamic", "infer:bert_dynamic", "torch", "inference", False,
             "BERT-base encoder (bf16), requests of random batch 1-64 and padded length 16-512"),
    Workload("infer_gpt_dynamic", "infer:gpt_dynamic", "torch", "inference", True,
             "GPT-2-small forward with logits (bf16), requests of batch 1-32, length 8-1024"),
    Workload("infer_resnet_dynamic", "infer:resnet_dynamic", "torch", "inference", False,
             "ResNet-50 (bf16, channels-last), requests of batch 1-64, square images 128-384 px"),
    Workload("gen_kv_greedy", "generate:kv_greedy", "torch", "generation", False,
             "decoder LM, greedy decoding of requests (batch 1-8, prompt 32-1024, 16-48 new tokens); "
             "the KV cache, ids and mask grow by concatenation every token"),
    Workload("gen_kv_beam", "generate:kv_beam", "torch", "generation", True,
             "decoder LM, beam search (4 beams; batch 1-4, prompt 32-512, 16-32 new tokens); every step reorders the cache with index_select"),
    Workload("train_bert_varbatch", "train:bert_varbatch", "torch", "training", False,
             "BERT masked-LM training (6 layers, bf16 autocast, AdamW), batch 4-64 and length 64-512 per step"),
    Workload("train_gpt_checkpoint", "train:gpt_checkpoint", "torch", "training", True,
             "decoder LM training with every block under torch.utils.checkpoint, batch 4-12, length 1024"),
    Workload("train_resnet_amp", "train:resnet_amp", "torch", "training", False,
             "ResNet-18 training, fp16 autocast and GradScaler, SGD; batch 16-128, images 128-256 px"),
    Workload("train_two_streams", "streams:two_streams", "torch", "streams", False,
             "convnet training fed by a copy stream: pinned host batches copied ahead on a side stream; "
             "frees on both streams"),
    Workload("infer_unet_diffusion", "diffusion:unet_denoise", "torch", "inference", False,
             "UNet with attention, denoising loops of 15 steps with classifier-free guidance, latents 32-64, batch 1-4"),
    Workload("train_moe_routing", "moe:moe_routing", "torch", "training", False,
             "mixture-of-experts (8 experts, top-2 routing) training: expert batches vary with the routing"),
    Workload("train_gnn_varsize", "gnn:gcn_varsize", "torch", "training", True,
             "graph convolution training on random graphs of 10k-200k nodes: gathers and index_add_ per edge"),
    Workload("cupy_arrays", "arrays:array_mix", "cupy", "arrays", False,
             "CuPy: elementwise chains, reductions, FFTs, matmuls and sorts of random shapes"),
    Workload("cupy_dataframe", "arrays:dataframe", "cupy", "dataframe", False,
             "CuPy dataframe-like partitions of 1e5-1e7 rows: filter, sort, gather, groupby, join"),
    Workload("cupy_kmeans_pca", "arrays:kmeans_pca", "cupy", "arrays", True,
             "CuPy cuML-like fitting: k-means and PCA (eigh, SVD) on datasets of 1e4-1e6 rows"),
]

BY_NAME = {w.name: w for w in WORKLOADS}
