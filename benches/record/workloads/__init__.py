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


# One row per trace: name | module:function | framework | kind | tuning or
# held out | what it runs.
TABLE = """
infer_bert_dynamic | infer:bert_dynamic | torch | inference | tuning | BERT-base encoder (bf16), requests of random batch 1-64 and padded length 16-512
infer_gpt_dynamic | infer:gpt_dynamic | torch | inference | held out | GPT-2-small forward with logits (bf16), requests of batch 1-32, length 8-1024
infer_resnet_dynamic | infer:resnet_dynamic | torch | inference | tuning | ResNet-50 (bf16, channels-last), requests of batch 1-64, square images 128-384 px
gen_kv_greedy | generate:kv_greedy | torch | generation | tuning | decoder LM, greedy decoding of requests (batch 1-8, prompt 32-1024, 16-48 new tokens); the KV cache, ids and mask grow by concatenation every token
gen_kv_beam | generate:kv_beam | torch | generation | held out | decoder LM, beam search (4 beams; batch 1-4, prompt 32-512, 16-32 new tokens); every step reorders the cache with index_select
train_bert_varbatch | train:bert_varbatch | torch | training | tuning | BERT masked-LM training (6 layers, bf16 autocast, AdamW), batch 4-64 and length 64-512 per step
train_gpt_checkpoint | train:gpt_checkpoint | torch | training | held out | decoder LM training with every block under torch.utils.checkpoint, batch 4-12, length 1024
train_resnet_amp | train:resnet_amp | torch | training | tuning | ResNet-18 training, fp16 autocast and GradScaler, SGD; batch 16-128, images 128-256 px
train_two_streams | streams:two_streams | torch | streams | tuning | convnet training fed by a copy stream: pinned host batches copied ahead on a side stream; frees on both streams
infer_unet_diffusion | diffusion:unet_denoise | torch | inference | tuning | UNet with attention, denoising loops of 15 steps with classifier-free guidance, latents 32-64, batch 1-4
train_moe_routing | moe:moe_routing | torch | training | tuning | mixture-of-experts (8 experts, top-2 routing) training: expert batches vary with the routing
train_gnn_varsize | gnn:gcn_varsize | torch | training | held out | graph convolution training on random graphs of 10k-200k nodes: gathers and index_add_ per edge
cupy_arrays | arrays:array_mix | cupy | arrays | tuning | CuPy: elementwise chains, reductions, FFTs, matmuls and sorts of random shapes
cupy_dataframe | arrays:dataframe | cupy | dataframe | tuning | CuPy dataframe-like partitions of 1e5-1e7 rows: filter, sort, gather, groupby, join
cupy_kmeans_pca | arrays:kmeans_pca | cupy | arrays | held out | CuPy cuML-like fitting: k-means and PCA (eigh, SVD) on datasets of 1e4-1e6 rows
train_lstm_varlen | rnn:lstm_varlen | torch | training | held out | LSTM language model training (3 layers, cuDNN, fp32, Adam), length 32-512 and batch from a token budget per step
gen_seq2seq_greedy | generate:seq2seq_greedy | torch | generation | held out | encoder-decoder (torch.nn.Transformer, 6+6 layers, bf16), greedy decoding with no cache: the whole prefix through the decoder every token
cupy_image | arrays:image_pipeline | cupy | arrays | held out | CuPy: batches of images of random sizes through an FFT blur, gradients, a percentile threshold, a pyramid and a histogram
"""


def _row(line):
    name, target, framework, kind, use, about = (cell.strip() for cell in line.split("|", 5))
    assert use in ("tuning", "held out"), line
    return Workload(name, target, framework, kind, use == "held out", about)


WORKLOADS = [_row(line) for line in TABLE.strip().splitlines()]

BY_NAME = {w.name: w for w in WORKLOADS}
