"""The chat format shared by the tokenizer, the corpus and the evaluation prompts.

Qwen-style special tokens, so engines that know Qwen chat models need no special casing:
``<|im_start|>{role}\\n{content}<|im_end|>\\n``. ``<|mask|>`` is the DFlash mask token: it never
occurs in training text; the draft sees its (target) embedding in every masked block slot.
"""

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"
# Order fixes the ids: 0, 1, 2, 3.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

Message = dict[str, str]


def render(messages: list[Message], add_generation_prompt: bool = False) -> str:
    """Python twin of CHAT_TEMPLATE (used to build the corpus without jinja)."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def exchange(user: str, assistant: str) -> list[Message]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
