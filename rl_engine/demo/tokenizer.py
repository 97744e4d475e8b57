"""Tokenizer for the demo task, trained with the ``tokenizers`` library.

transformers 5 loads every ``qwen2`` checkpoint's tokenizer through ``Qwen2Tokenizer``,
which rebuilds the backend from the saved vocabulary and merges with Qwen's own pipeline
(NFC, Qwen's pre-tokenization regex, byte-level BPE). So the tokenizer is trained with
exactly that pipeline — otherwise ``AutoTokenizer.from_pretrained`` would silently tokenize
differently from what the model was trained on. Qwen's regex isolates every digit
(``"37"`` is ``["3", "7"]``), which keeps arithmetic learnable digit by digit.

The vocabulary is the 256 byte-level symbols (any text encodes, nothing is unknown) plus the
special tokens; ``+`` and ``=`` come out as separate pre-tokens, so the task text needs no
merges and none are learned.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD = "<pad>"
EOS = "<eos>"
BOS = "<bos>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
# The order fixes the ids: pad=0, eos=1, bos=2, then the chat role markers.
SPECIAL_TOKENS = [PAD, EOS, BOS, SYSTEM, USER, ASSISTANT]

# Role markers, content, and an eos closing each assistant turn (the same eos the model
# emits after a bare answer), so chat-template mode and plain-prompt mode end alike.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}" + SYSTEM + "{{ message['content'] }}"
    "{%- elif message['role'] == 'user' -%}" + USER + "{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}" + ASSISTANT + "{{ message['content'] }}" + EOS + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + ASSISTANT + "{%- endif -%}"
)


def _qwen_pretokenize_regex() -> str:
    # Imported, not restated: it must match what Qwen2Tokenizer rebuilds at load time.
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    return PRETOKENIZE_REGEX


def train_tokenizer(corpus: Iterable[str]):
    """Train the byte-level BPE tokenizer on ``corpus`` and wrap it for transformers."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_qwen_pretokenize_regex()), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        # Room for the alphabet and the special tokens only: single digits must stay single
        # tokens, and the task has nothing else worth merging.
        vocab_size=len(SPECIAL_TOKENS) + len(alphabet),
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    # Sorted and deduplicated so the result does not depend on the corpus order.
    tok.train_from_iterator(sorted(set(corpus)), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        # Byte-level: nothing is unknown. Saved explicitly as null, or Qwen2Tokenizer would
        # add its default "<|endoftext|>" as an extra token beyond the model's vocabulary.
        unk_token=None,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
        # Generation batches are left-padded so that every prompt ends at the same position.
        padding_side="left",
        model_max_length=128,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
