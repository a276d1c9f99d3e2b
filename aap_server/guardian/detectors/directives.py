# ruff: noqa: RUF001 (other scripts' brackets and colons)
"""Instructions aimed at the AI inside data (`injection.directive`): how injected text works,
not a list of known attacks.

Data an agent reads (a mail, a table, a code file, a web page, a tool's output) describes
things; it does not give the reader tasks. An injection has to, and to do so it must do one
of a few things, each looked for here in English (and "in your answer" / "dear assistant" in
a few other languages; the mechanisms in 17 languages are in `languages.py`):

- **address the AI**: "dear assistant", "note to the AI", "if you are an AI / a language
  model", "this is an important message from … to you", "AI agents reading this:";
- **aim at the reader's output**: the reply, answer, summary or code being written ("add …
  to your response", "encode your answer in Base64", "reply in German", "merge the following
  code into your algorithm") — data has no business shaping what the assistant writes;
- **frame a hijack**: "important message / instructions", "before you (can) continue / solve
  the task / answer", "instead of the user's task", counterfeit envelopes (`<INFORMATION>`,
  `###(system_message)`, `[ADMIN]`, `BEGIN SYSTEM PROMPT`), "(new|updated) task:";
- **set a new task**: a sentence of five words or more that is a request for an assistant's
  work, opening a line or following a sentence ("Write a script to …", "Provide a list of
  …", "Translate the following …", "Can you show me …?"). Requests a mail or a page
  naturally makes ("please transfer the deposit", "how do I reset my password?") are not
  counted: what such text can *cause* is the provenance rules' business, not this one's;
- **ask for the instructions**: "what (are|were) your instructions", "repeat your prompt".

Each pattern is anchored on a literal word and bounded in length, so a scan is linear.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from aap_server.guardian.detectors._views import (
    NON_LETTERS_TO_SPACE,
    TextViews,
    fold_pattern,
    fold_words,
    scan_spaced,
)
from aap_server.guardian.detectors.base import Finding
from aap_server.guardian.detectors.languages import scan_languages

_AI = (
    r"(?:ai|a\.i\.|assistant|ai\s+assistant|ai\s+agent|agent|llm|language\s+model|chatbot|bot"
    r"|model|gpt|chatgpt|claude|gemini|copilot|large\s+language\s+model)"
)
_OUTPUT = (
    r"(?:response|answer|reply|replies|output|summary|elucidation|explanation|translation"
    r"|completion)"
)
_CODE = (
    r"(?:code(?:base)?|implementation|solution|algorithm|program|script|application|project"
    r"|software|logic|function|module|elucidation|architecture|framework|system)"
)
_INSERT = (
    r"(?:add|include|incorporat|integrat|embed|insert|inject|merg|append|utiliz|leverag"
    r"|blend|weav|execut|enlist|introduc|ensure|put|place|mention|attach|implant|fuse|infus"
    r"|combin|consider|apply|adopt|employ|let|make|keep|don't\s+(?:hesitate|forget)|feel\s+free"
    r"|boost|enhanc|elevat|streamlin|refin|augment|improv|amplif|fortif|strengthen|optimi[sz]"
    r"|develop|validat|give|complement|ascend|evolv|enrich)"
)
_TASK_VERBS = (
    r"(?:write|provide|explain|describe|summari[sz]e|translate|analy[sz]e|determine|recommend"
    r"|suggest|draft|compose|develop|classify|list|generate|create|compile|outline|compare"
    r"|evaluate|assess|identify|calculate|convert|rewrite|rephrase|paraphrase|break\s+down"
    r"|give\s+me|tell\s+me|show\s+me|help\s+me|teach\s+me|find\s+me|reply|respond|answer"
    r"|replace|encode|encrypt|decode|reverse|spell|output|print|repeat)"
)
# Questions put *to the reader*; not "how do I …?" or "what is …?", which FAQ pages and
# forum threads are full of.
_QUESTION_OPENERS = r"(?:can|could|would|will)\s+you|do\s+you\s+know|is\s+this|are\s+these"

# (words a pattern may start with, `_` for a space; the pattern): tried only where one of its
# words starts.
_TRIGGERED: list[tuple[str, str]] = [
    # addressing the AI
    (
        "dear hey hello attention note message instruction calling",
        rf"(?:dear|hey|hello|attention|note\s+(?:to|for)|message\s+(?:to|for)|instructions?"
        rf"\s+(?:to|for)|calling\s+all)\s+(?:the\s+|an?\s+|all\s+|any\s+)?{_AI}s?\b",
    ),
    ("if_you", rf"if\s+you\s+are\s+(?:an?\s+|the\s+)?(?:\w+\s+){{0,2}}?{_AI}\b"),
    (
        "ai_ assistant agent llm language chatbot bot_ model gpt claude gemini copilot",
        rf"{_AI}s?\s+(?:reading|processing|parsing|summari[sz]ing|seeing)\s+(?:this|these)\b",
    ),
    (
        "message note request instruction",
        r"(?:message|note|request|instruction)s?\s+from\s+(?:me|the\s+user|your\s+user|the\s+"
        r"(?:owner|admin|administrator|developer))\b[^.\n]{0,80}?\bto\s+you\b",
    ),
    ("to_you,", r"to\s+you,\s+(?:\w+\s*){0,3}[,.]"),
    # aimed at the output being written
    (
        "your assistant's ai's",
        # not "thanks for / looking forward to / awaiting your reply": mail etiquette
        r"(?<!for\s)(?<!to\s)(?<!await\s)(?<!awaiting\s)(?<!receive\s)(?<!receiving\s)"
        r"(?<!received\s)(?:your|assistant's|ai's)\s+(?:\w+\s+)?(?:response|answer|reply"
        r"|replies|elucidation|output)s?\b",
    ),
    (
        "your",
        rf"(?:(?<=in\s)|(?<=of\s)|(?<=into\s)|(?<=within\s)|(?<=from\s)|(?<![dr]\sto\s)"
        rf"(?<=to\s))your\s+"
        rf"(?:\w+\s+)?{_OUTPUT}s?\b",
    ),
    (
        "following below subsequent",
        rf"(?:following|below|subsequent)\s+(?:\w+\s+)?(?:code|snippet|lines?|block|section"
        rf"|excerpt|segment|fragment)\b[^\n]{{0,120}}?\b(?:your\s+(?:\w+\s+)?{_CODE}|(?:the\s+)?"
        rf"code\s+you\s+(?:develop|write|produce|create))\b",
    ),
    (
        "your",
        rf"your\s+(?:\w+\s+)?{_CODE}\b[^\n]{{0,80}}?\b(?:following|below|subsequent)\s+"
        rf"(?:\w+\s+)?(?:code|snippet|block|section|excerpt)\b",
    ),
    (
        "reply respond answer write",
        r"(?:reply|respond|answer|write)\s+(?:only\s+)?(?:in|using|with)\s+(?:\w+\s+){0,2}?"
        r"(?:base64|base58|hex|rot13|morse|binary|reverse|uppercase|lowercase|emojis?|german"
        r"|french|spanish|italian|chinese|japanese|russian|portuguese|pig\s+latin|code|cipher"
        r"|riddles?|rhymes?|anagrams?|caps)\b",
    ),
    # hijack framing
    (
        "important urgent critical priority",
        r"(?:important|urgent|critical|priority)\s+(?:message"
        r"|instructions?|notice|update|directive|task)\s+(?:from|for|to)\b",
    ),
    (
        "before",
        r"before\s+you\s+(?:can\s+|could\s+|do\s+|start\s+|begin\s+|go\s+on\s+)?(?:continue"
        r"|proceed|solve|answer|respond|reply|complete|finish|start|begin|do\s+(?:that|this|so"
        r"|anything)|summari[sz]e|move\s+on|carry\s+on|go\s+on|continuing|proceeding|answering"
        r"|responding)",
    ),
    (
        "instead rather",
        r"(?:instead\s+of|rather\s+than)\s+(?:doing\s+|solving\s+|answering\s+|completing\s+)?"
        r"(?:the|your|what)\s+(?:\w+\s+)?(?:user(?:'s)?|original|initial|current|given)\s+(?:\w+\s+)?"
        r"(?:task|request|question|asked)",
    ),
    (
        "task instruction order objective goal directive",
        r"(?:(?<=new\s)|(?<=updated\s)|(?<=additional\s)|(?<=real\s)|(?<=actual\s)"
        r"|(?<=secret\s)|(?<=hidden\s)|(?<=urgent\s)|(?<=first\s)|(?<=next\s))(?:task"
        r"|instructions?|orders?|objective|goal|directive)\s*(?:for\s+you\s*)?[:\-]",
    ),
    (
        "begin start",
        r"(?:begin|start)\s+(?:of\s+)?(?:system|admin|developer)\s+(?:prompt|message"
        r"|instructions?)\b",
    ),
    # asking for the instructions
    (
        "what which",
        r"(?:what|which)\s+(?:are|were|is)\s+(?:your|the)\s+(?:\w+\s+)?(?:instructions|system"
        r"\s+prompt|initial\s+prompt|guidelines|rules)\b",
    ),
    (
        "repeat print reveal show output recite",
        r"(?:repeat|print|reveal|show|output|recite)\s+(?:\w+\s+)?"
        r"(?:your|the)\s+(?:\w+\s+)?(?:instructions|prompt|system\s+message|initial\s+message"
        r"|configuration|guidelines)\b",
    ),
    # other languages: aiming at the reply, addressing the AI (the other mechanisms are in
    # `languages.py`)
    (
        "respuesta réponse antwort resposta risposta ответ",
        r"(?:(?<=en tu )|(?<=dans ta )|(?<=dans votre )|(?<=in deiner )|(?<=in ihrer )"
        r"|(?<=na sua )|(?<=nella tua )|(?<=в своём )|(?<=в своем )|(?<=в твоём )"
        r"|(?<=в твоем )|(?<=в вашем ))"
        r"(?:respuesta|réponse|antwort|resposta|risposta|ответе)\b",
    ),
    (
        "querido estimado cher lieb caro cara дорог",
        r"(?:querido|estimado|cher|chère|liebe[rs]?|caro|cara|дорогой)\s+(?:asistente|assistant"
        r"|assistent|assistente|ассистент|ia|ki|ии)\b",
    ),
]
# Counterfeit envelopes (start with a symbol), and CJK phrasings (no word boundaries).
_MARKUP = (
    re.compile(
        r"<\s*/?\s*(?:information|important|instructions?|admin|administrator|secret|hidden"
        r"|override|prompt|context|directive|note_to_ai|ai_instructions?"
        r"|assistant_instructions?)\s*>"
    ),
    re.compile(
        r"##+\s*\(?\s*(?:system|admin|developer|assistant|ai)[\s_-]*(?:message|prompt"
        r"|instructions?|override|note)\s*\)?"
    ),
    re.compile(
        r"\[\s*(?:system|admin|administrator|developer|assistant|ai|instructions?|systeme"
        r"|sistema|systeem|sistem|systemu|administrateur|administrador)\s*"
        r"(?:message|note|override|prompt|mensaje|mensagem|nachricht|messaggio)?\s*\]\s*:?"
    ),
)
# Each with the character every match of it starts with.
_MARKUP_BY_LEAD = tuple(zip("<#[", _MARKUP, strict=True))
# Envelopes in other scripts: `【系统】`, `[システム]`, `<система>`, `### النظام`.
_MARKUP_OTHER = re.compile(
    r"(?:[\[<【(（]|#{2,})\s*(?:系统|系統|システム|시스템|النظام|सिस्टम|система|системное"
    r"|管理员|管理者|관리자|المسؤول)\s*(?:消息|通知|提示|メッセージ|메시지|رسالة|संदेश"
    r"|сообщение|промпт)?\s*(?:[\]>】)）]|:|：)"
)
_CJK = re.compile(r"在你的回答中|在您的回答中|你的回答|回答中加入|あなたの回答|回答に|返答に")
_CJK_KEYS = ("回", "返")  # one of them is in every `_CJK` phrase
assert all(any(key in phrase for key in _CJK_KEYS) for phrase in _CJK.pattern.split("|"))
_SCRIPT_WORDS = (
    *("系统", "系統", "システム", "시스템", "النظام", "सिस्टम", "система", "管理员", "管理者"),
    *("관리자", "المسؤول"),
)  # one of them is in every `_MARKUP_OTHER` match (`системное` holds `система`)

# A request standing as a sentence of its own at the start of a line or after a sentence's
# end: a task verb, or a question to an assistant; or an order to put something into the
# reader's output. Data may quote one inside a sentence; a sentence that *is* one, is a task.
_TASK = re.compile(
    rf"(?:please\s+|kindly\s+)?(?:{_TASK_VERBS})\s+(?:me\s+|us\s+)?(?:a|an|the|all|every|some"
    rf"|this|these|that|how|what|why|your|my|our|in|into|to|with|using|each|its|their|any)\b(?=(?:\s+[^\n.!?\s]+){{3}})[^\n.!?]{{3,200}}[.!?]"
    rf"|{_QUESTION_OPENERS}\b[^\n?]{{3,200}}\?"
)
# Orders about the reader's own output, at a sentence's start.
_ORDER = (
    rf"(?:(?:\w+|don't)\s+){{0,2}}?your\s+(?:\w+\s+)?message\b"
    rf"|{_INSERT}\w*\s[^\n]{{0,60}}?\b(?:following|below|subsequent)\s+(?:\w+\s+)?"
    rf"(?:code|snippet|block|section|excerpt)\b"
)
_TRIGGERS: dict[str, list[re.Pattern[str]]] = {}
for _words, _pattern in _TRIGGERED:
    # Written as the normalised view reads text (`réponse` is scanned as `reponse`).
    _compiled = re.compile(fold_pattern(_pattern))
    for _word in fold_words(_words).split():
        _TRIGGERS.setdefault(_word.replace("_", " "), []).append(_compiled)
# Triggers with letters other than ASCII ones (`ответ`): searched in every non-ASCII text.
_OTHER_TRIGGERS = tuple(word for word in _TRIGGERS if not word.isascii())
# In ASCII text a trigger word can only occur at a word's start if its leading letters begin
# one of the text's words, so only those triggers are searched for: one `translate` and
# `split` (C speed) list the words (`TextViews.words`), instead of a `find` pass over the
# text per trigger.
_TRIGGERS_BY_WORD: dict[bytes, list[tuple[bytes, str]]] = {}
for _word in _TRIGGERS:
    if _word.isascii():
        _letters = _word.encode("ascii").translate(NON_LETTERS_TO_SPACE).split()[0]
        _TRIGGERS_BY_WORD.setdefault(_letters[:2], []).append((_letters, _word))
# Words (each a whole word in a match) without which `_TASK_AT` cannot match ASCII text: the
# first word of each task verb, "your" and the words that point at a code block; and the
# question openers' first words, which also need the word after them.
_TASK_WORDS = frozenset(
    first.replace("[sz]", letter).encode("ascii")
    for first in [alt.split("\\s")[0] for alt in _TASK_VERBS[3:-1].split("|")]
    + ["your", "following", "below", "subsequent"]
    for letter in "sz"
)
_YOU_QUESTION_WORDS = frozenset((b"can", b"could", b"would", b"will", b"do"))
# A task sentence opens a line or follows a sentence's end.
_TASK_AT = re.compile(
    r"(?:^[ \t>*\-]*|(?<=[.!?] ))(?:(?P<task>" + _TASK.pattern + ")|" + _ORDER + ")",
    re.MULTILINE,
)


def scan_directives(v: TextViews, *, joined: bool = False) -> list[Finding]:
    """Every instruction aimed at the AI in the text (see the module's docstring).

    Each pattern starts with a trigger word, found with `str.find` (C speed) and tried only
    there; in ASCII text only the triggers that begin one of its words are looked for. Task
    sentences only where a line or sentence starts with a word that can open one. So the
    cost is a few passes over the text plus work at the few places that matter. A trigger
    joined to the words around it (`important_message_from`) is tried again in a window of
    the text read with its joints as spaces (`_views.spaced_words`), with `joined`."""
    text, lower = v.text, v.lower
    words = v.words
    ascii = lower.isascii()
    glued: list[int] = []
    out = triggered(v, glued if joined else None)
    if glued:
        windows = [(max(0, at - _GLUED_BEFORE), at + _GLUED_AFTER) for at in glued]
        seen = {(f.start, f.end) for f in out}
        out += [f for f in scan_spaced(text, windows, triggered) if (f.start, f.end) not in seen]
    for start in _sentence_starts(lower) if _may_hold_task(words) else ():
        m = _TASK_AT.match(lower, start)
        if m is not None and (m.group("task") is None or _ends_sentence(lower, m.end())):
            out.append(_finding(text, *m.span()))
    for lead, pattern in _MARKUP_BY_LEAD:
        if lead in lower:  # (one `memchr`: prose seldom has `<`, `#` or `[`)
            out += [_finding(text, *m.span()) for m in pattern.finditer(lower)]
    if not ascii:
        # Each phrase holds a character of `_CJK_KEYS` or a word of `_SCRIPT_WORDS`: one `in`
        # each (C speed), where the patterns' searches try every character.
        if any(key in lower for key in _CJK_KEYS):
            out += [_finding(text, *m.span()) for m in _CJK.finditer(lower)]
        if any(word in lower for word in _SCRIPT_WORDS):
            out += [_finding(text, *m.span()) for m in _MARKUP_OTHER.finditer(lower)]
    out += [_finding(text, *span) for span in scan_languages(lower, words)]
    return out


_JOINERS = "_+.-%&;0"  # (`%20` ends with `0`, `&nbsp;` with `;`)
_RUN = re.compile(r"[a-z0-9_.+%&;-]{0,80}")
_NAME_END = re.compile(r"[\"'`]?[ \t]*[:=(]")
# A window read with its joints as spaces, around a glued trigger (`&nbsp;` is six characters
# a space).
_GLUED_BEFORE = 80
_GLUED_AFTER = 600


def _glued(lower: str, at: int, length: int) -> bool:
    """Whether the trigger word at `at` is joined to a word before or after it by a joint
    (`_views.spaced_words`), in a run that is not a name used as code (`message_id:`)."""
    after = lower[at + length : at + length + 1]
    if not (after and after in _JOINERS[:6]) and not (at > 1 and lower[at - 1] in _JOINERS):
        return False
    run = _RUN.match(lower, at)
    return run is not None and _NAME_END.match(lower, run.end()) is None


def triggered(v: TextViews, glued: list[int] | None = None) -> list[Finding]:
    """The trigger patterns' findings; where none matches at a trigger joined to the words
    around it (`_glued`), its offset is added to `glued`."""
    text, lower = v.text, v.lower
    out: list[Finding] = []
    for word in _triggers_to_search(v.words, lower.isascii()):
        patterns = _TRIGGERS[word]
        at = lower.find(word)
        while at != -1:
            if at == 0 or not lower[at - 1].isalpha():
                found = False
                for pattern in patterns:
                    m = pattern.match(lower, at)
                    if m is not None:
                        out.append(_finding(text, *m.span()))
                        found = True
                if not found and glued is not None and _glued(lower, at, len(word)):
                    glued.append(at)
            at = lower.find(word, at + 1)
    return out


def _triggers_to_search(words: set[bytes], ascii: bool = True) -> Iterable[str]:
    """The trigger words that may occur at a word's start: the ASCII ones whose leading
    letters begin one of the text's `words` (a trigger at a word's start has no letter
    before it, so its letters begin a run of ASCII letters); in other text, every trigger
    with other letters too."""
    present: set[str] = set() if ascii else set(_OTHER_TRIGGERS)
    for token in words:
        for letters, word in _TRIGGERS_BY_WORD.get(token[:2], ()):
            if token.startswith(letters):
                present.add(word)
    return present


def _may_hold_task(words: set[bytes]) -> bool:
    """False when the text lacks every word a `_TASK_AT` match has to contain as a whole
    word (set off by spaces or other non-letters, so a run of ASCII letters of its own): a
    task verb, "your", "following/below/subsequent", or a question opener with the word
    after it."""
    return (
        not words.isdisjoint(_TASK_WORDS)
        or (b"you" in words and not words.isdisjoint(_YOU_QUESTION_WORDS))
        or (b"is" in words and b"this" in words)
        or (b"are" in words and b"these" in words)
    )


def _sentence_starts(lower: str) -> list[int]:
    """Where lines and sentences start (at or before their first word)."""
    starts = [0]
    for mark in ("\n", ". ", "? ", "! "):
        at = lower.find(mark)
        while at != -1:
            starts.append(at + (1 if mark == "\n" else 2))
            at = lower.find(mark, at + 1)
    return starts


def _ends_sentence(lower: str, end: int) -> bool:
    """A task sentence ends a line, the text, or is followed by another sentence."""
    rest = lower[end : end + 2]
    return rest == "" or rest[0] in "\n\r" or rest.isspace() or rest[0] in " \t\"'"


def _finding(text: str, start: int, end: int) -> Finding:
    return Finding(
        detector="injection.directive",
        category="injection",
        start=start,
        end=end,
        value=text[start:end],
    )
