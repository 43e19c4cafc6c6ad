"""Evaluation of encoders and of the search built on them: BEIR retrieval through the index (``beir``), STS
(``sts``), LAMA and the fill-mask suite (``lama``, ``plausibility``). A layer of its own between training and
the index: the trainers and the export's model card use it, and it uses the index to search. Masked-token
accuracy is pre-training's own (``encoder_training.pretraining.heldout``)."""
