# ruff: noqa: RUF001 (the vocabularies are written in their own scripts)
"""Injection mechanisms in the major languages (`injection.directive`), built from small
per-language vocabularies of their parts rather than from whole sentences.

An attack has parts that every language has words for, and that benign data rarely puts in
one clause together:

- **override**: a verb of ignoring/forgetting + a noun for instructions/rules/prompt + a word
  that points at the reader's earlier ones (previous, above, all, your, system), with no
  negation at the verb ("don't forget the previous instructions" is a reminder);
- **reveal**: a verb of showing/repeating + instructions/prompt + system/your/hidden/initial;
- **orders for the AI**: a word for the AI/assistant/model + a modal (must, has to, doit, muss,
  必须, 해야) + a verb that acts on the world (send, forward, transfer, upload, delete, pay),
  and the AI is not someone's assistant ("my assistant must send ...");
- **hijack framing**: "important message", "before you continue / answer", "instead of the
  task" as each language says it;
- **counterfeit envelopes**: `[SYSTÈME]`, `【系统】`, `<システム>`, `### Система`.

The parts are looked for in the clause around an anchor word (an instructions noun, an AI
word, a framing word): up to `_BACK` characters back and `_AHEAD` ahead, cut at a sentence's
end. Text is scanned in its normalised view (accents folded: the vocabularies are written
through the same folding, see `fold_pattern`). Cost: a language is looked at only when the
text can hold it: for Latin-script languages when one of the text's words begins with an
anchor; for the others when the text has characters of the script (one `translate` of the
UTF-8 bytes and a `in` per script); then a `find` per anchor and bounded regex work per
clause, each clause once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aap_server.guardian.detectors._views import fold_pattern, fold_words, non_ascii_of

# Scripts, by the lead byte of their characters in UTF-8.
_SCRIPT_LEADS = {
    "cyrillic": range(0xD0, 0xD4),
    "arabic": range(0xD8, 0xDC),
    "indic": range(0xE0, 0xE1),
    "kana": range(0xE3, 0xE4),
    "han": range(0xE4, 0xEA),
    "hangul": range(0xEA, 0xEE),
}
_SCRIPT_CODES = {name: bytes([0x41 + i]) for i, name in enumerate(_SCRIPT_LEADS)}
_LEAD_TABLE = bytes(
    next((code[0] for name, code in _SCRIPT_CODES.items() if b in _SCRIPT_LEADS[name]), 0)
    for b in range(256)
)

_BACK = 120
_AHEAD = 160
_CLAUSE_END = re.compile(r"[\n!?;。！？؟।]|\.(?=\s|$)")


@dataclass(frozen=True)
class Lexicon:
    """The words of one language for the parts of an attack (see the module docstring).

    Word lists are space-separated; `_` stands for a space, a trailing `*` for "and any
    ending". In Latin-script languages words start at a word boundary (`latin`); in the others
    they are matched anywhere (no spaces between words, or particles glued on)."""

    name: str
    script: str | None  # None: Latin script (gated by the text's words)
    ignore: str
    instructions: str
    previous: str
    negation: str
    reveal: str
    hidden: str  # what makes instructions the reader's own: system, your, hidden, initial
    ai: str
    owner: str  # words around an AI word that make it a person's assistant
    modal: str
    act: str
    framing: str  # a regex (folded): whole framing phrases
    frame_anchors: str
    function_words: str = ""  # common words of the language that are no English words


def _alternation(spec: str, latin: bool) -> str:
    """The words of `spec` as one regex alternation (one that never matches when empty)."""
    parts = []
    for word in fold_words(spec).split():
        stem = word.endswith("*")
        body = re.escape(word.rstrip("*")).replace("_", r"\s+")
        if latin:
            body = r"\b" + body + (r"\w*" if stem else r"\b")
        parts.append(body)
    return "(?:" + "|".join(parts) + ")" if parts else "(?!)"


_PARTS = (
    *("ignore", "instructions", "previous", "negation", "reveal", "hidden", "ai", "owner"),
    *("modal", "act"),
)
# The parts whose words anchor a clause (not qualifiers and modals: "all", "must" are in every
# other clause).
_ANCHOR_PARTS = ("ignore", "instructions", "reveal", "ai", "frame_anchors")
# Every part, and a language's own function words, tell that a text may be in that language.
_EVIDENCE_PARTS = (*_PARTS, "frame_anchors", "function_words")
# Common English words (and the English words other languages borrow: prompt, assistant,
# model). A Latin-script language's word that is one of these (or, a stem, begins one) is no
# evidence of that language: English text would have every such language look at its clauses.
_ENGLISH_TEXT = """a about above after again against all also am an and any are as at be because
    been before being below between both but by can could did do does doing down during each few
    for from further had has have having he her here hers him his how i if in into is it its
    just me more most my no nor not now of off on once only or other our out over own same
    she should so some such than that the their them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with
    would you your yours instruction instructions prompt prompts assistant assistants agent
    agents model models chatbot ai system systems original initial directive directives rule
    rules secret important message note ignore ignored forget send show reveal instead admin
    manager professor program regular statement post share transfer upload delete pay wire
    remove leak email mail sue die men son pin"""
_ENGLISH = frozenset(_ENGLISH_TEXT.split())


@dataclass(frozen=True)
class _Anchor:
    text: str  # folded, lower-case, `_` as a space
    stem: bool  # may be followed by more letters


def _english(word: str, stem: bool) -> bool:
    return any(w == word or (stem and w.startswith(word)) for w in _ENGLISH)


def _words_of(lex: Lexicon, fields: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(word, stem) of the given parts of `lex`, folded; `_` as a space."""
    out = []
    for field in fields:
        for word in fold_words(getattr(lex, field)).split():
            out.append((word.rstrip("*").replace("_", " "), word.endswith("*")))
    return out


def _key(text: str) -> bytes:
    """The prefilter's key of a Latin-script word or phrase: the first four letters of its
    first run of letters (as `ascii_words` splits the text: `dis-moi` is `dis`)."""
    return _letter_runs(text)[0][:4]


class _Compiled:
    """A lexicon's parts compiled, its anchors (the literal words found with `find`) and, for
    a Latin-script language, the keys of its words that are no English words (evidence)."""

    def __init__(self, lex: Lexicon) -> None:
        self.name = lex.name
        self.script = lex.script
        self.latin = lex.script is None
        self.part = {
            name: re.compile(_alternation(getattr(lex, name), self.latin)) for name in _PARTS
        }
        self.framing = re.compile(fold_pattern(lex.framing))
        anchors: dict[str, _Anchor] = {}
        # English has its own detectors for the rest; here only its orders for the AI.
        for text, stem in _words_of(lex, ("ai",) if lex.name == "en" else _ANCHOR_PARTS):
            # A stem shorter than the prefilter's four-letter key anchors as a whole word.
            if self.latin and len(_letter_runs(text)) == 1 and len(text) < 4:
                stem = False
            anchors.setdefault(text, _Anchor(text, stem))
        self.anchors = tuple(anchors.values())
        # Other scripts: all anchors in one pass (one `find` per anchor is slow on such text).
        self.anchor_pattern = re.compile("|".join(re.escape(a.text) for a in self.anchors))
        self.other_keys = _other_keys([a.text for a in self.anchors])
        self.evidence = frozenset(
            _key(text)
            for text, stem in _words_of(lex, _EVIDENCE_PARTS)
            if self.latin and lex.name != "en" and not _english(text, stem)
        )


_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")


def _other_keys(anchors: list[str]) -> tuple[str, ...] | None:
    """Strings one of which every anchor holds: its longest run of non-ASCII characters,
    less those holding a shorter one. A run stays whole in the text's non-ASCII characters
    (`non_ascii_of`), so where none of these is, no anchor is. None if an anchor is ASCII."""
    runs = [max(_NON_ASCII_RUN.findall(a), key=len, default="") for a in anchors]
    if not all(runs):
        return None
    return tuple(sorted(r for r in set(runs) if not any(o != r and o in r for o in runs)))


def _negated(c: _Compiled, clause: str, span: tuple[int, int], verb: re.Match[str]) -> bool:
    """A negation just before the span or in it or right after it (German `... nicht`,
    Japanese `無視しないで`), but not inside the verb (`не обращай внимания` is one)."""
    negation, (start, end) = c.part["negation"], span
    before = negation.search(clause, max(0, start - 16), verb.start())
    return before is not None or negation.search(clause, verb.end(), end + 8) is not None


# A job title, not the AI: "assistant de direction", "asistente de ventas" (but "assistente
# de IA" is the AI).
_JOB_TITLE = re.compile(r"\s+(?:de|di|da|do|du|der|des|del|della)\s+(?!ia\b|ai\b|ki\b|l'ia\b)\w")
# A framing phrase stands at its clause's start, or is set off by a comma or colon
# ("Antes de responder, ..."; not "revisa el contrato antes de responder al cliente").
_SET_OFF = re.compile(r"\s*[,:;，：、]")
_CLAUSE_START = re.compile(r"[\s\"'«»“”„()\[\]*#>\-]*")


def _rules(c: _Compiled, clause: str) -> list[tuple[int, int]]:
    """Spans (in `clause`) of the attacks `c`'s parts make in this clause."""
    part = c.part
    out: list[tuple[int, int]] = []
    noun = part["instructions"].search(clause)
    if noun is not None:
        for verb_part, qualifier_part in (("ignore", "previous"), ("reveal", "hidden")):
            verb = part[verb_part].search(clause)
            if verb is not None and part[qualifier_part].search(clause):
                span = (min(verb.start(), noun.start()), max(verb.end(), noun.end()))
                if not _negated(c, clause, span, verb):
                    out.append(span)
    ai = part["ai"].search(clause)
    if ai is not None and part["modal"].search(clause) is not None:
        act = part["act"].search(clause)
        owned = part["owner"].search(clause, max(0, ai.start() - 14), ai.end() + 18)
        if c.latin and owned is None:
            owned = _JOB_TITLE.match(clause, ai.end())
        if act is not None and owned is None:
            span = (min(ai.start(), act.start()), max(ai.end(), act.end()))
            if not _negated(c, clause, span, act):
                out.append(span)
    frame = c.framing.search(clause)
    if frame is not None and (
        _CLAUSE_START.match(clause).end() >= frame.start()  # type: ignore[union-attr]
        or _SET_OFF.match(clause, frame.end())
    ):
        out.append(frame.span())
    return out


def _clause(lower: str, at: int) -> tuple[int, int]:
    """The clause around `at`: back to the last sentence end (at most `_BACK` characters),
    ahead to the next (at most `_AHEAD`)."""
    low = max(0, at - _BACK)
    start = low
    for m in _CLAUSE_END.finditer(lower, low, at):
        start = m.end()
    end = _CLAUSE_END.search(lower, at, min(len(lower), at + _AHEAD))
    return start, (end.start() if end is not None else min(len(lower), at + _AHEAD))


def _scripts(lower: str) -> set[str]:
    """The scripts (of `_SCRIPT_LEADS`) that have characters in the text."""
    leads = lower.encode("utf-8", "surrogatepass").translate(_LEAD_TABLE)
    return {name for name, code in _SCRIPT_CODES.items() if code in leads}


def _latin_anchors(keys: set[bytes]) -> set[tuple[int, _Anchor]]:
    """(lexicon index, anchor) of the Latin-script anchors that may stand in a text whose words
    begin with these `keys` (first four letters, the whole word if shorter): an intersection
    (C speed) giving a superset that `_positions` then narrows."""
    return {entry for key in keys & _LATIN_KEYS for entry in _LATIN_BY_KEY[key]}


def _positions(lower: str, anchor: _Anchor, latin: bool) -> list[int]:
    """Where the anchor stands: at a word's start in Latin script (and, if not a stem, at its
    end too); anywhere in other scripts."""
    found = []
    size = len(anchor.text)
    at = lower.find(anchor.text)
    while at != -1:
        if not latin or (
            (at == 0 or not lower[at - 1].isalnum())
            and (anchor.stem or at + size == len(lower) or not lower[at + size].isalnum())
        ):
            found.append(at)
        at = lower.find(anchor.text, at + 1)
    return found


def scan_languages(lower: str, words: set[bytes]) -> list[tuple[int, int]]:
    """Spans in `lower` (the normalised, lower-cased text) of the attacks the lexicons know.
    `words`: the text's runs of ASCII letters (as bytes), the Latin-script gate."""
    todo: dict[int, list[_Anchor]] = {}
    keys = {word[:4] for word in words}
    for index, anchor in _latin_anchors(keys):
        c = _COMPILED[index]
        if c.name == "en" or not keys.isdisjoint(c.evidence):
            todo.setdefault(index, []).append(anchor)
    if not lower.isascii():
        scripts = _scripts(lower)
        for index, c in enumerate(_COMPILED):
            if c.script is not None and c.script in scripts:
                todo[index] = list(c.anchors)
    out: list[tuple[int, int]] = []
    others: str | None = None
    for index, anchors in todo.items():
        c = _COMPILED[index]
        if c.latin:
            hits = sorted(at for anchor in anchors for at in _positions(lower, anchor, True))
        else:
            # One `in` per key on the text's non-ASCII characters says whether an anchor may
            # be there, where the anchors' pattern tries every character of the text.
            if c.other_keys is not None:
                if others is None:
                    others = non_ascii_of(lower)
                if not any(key in others for key in c.other_keys):
                    continue
            hits = [m.start() for m in c.anchor_pattern.finditer(lower)]
        done = -1
        for at in hits:
            if at < done:
                continue
            start, end = _clause(lower, at)
            done = end
            out += [(start + a, start + b) for a, b in _rules(c, lower[start:end])]
    return out


_ASCII_NON_LETTERS = bytes(c for c in range(128) if not chr(c).isalpha()) + bytes(range(128, 256))
_NON_LETTERS_TO_SPACE = bytes.maketrans(_ASCII_NON_LETTERS, b" " * len(_ASCII_NON_LETTERS))


def ascii_words(lower: str) -> set[bytes]:
    """The runs of ASCII letters in the text (other characters split words)."""
    return set(_letter_runs(lower))


def _letter_runs(lower: str) -> list[bytes]:
    return lower.encode("ascii", "replace").translate(_NON_LETTERS_TO_SPACE).split()


LEXICONS = (
    Lexicon(
        name="en",
        script=None,
        ignore="",
        instructions="",
        previous="",
        negation="not don't dont never",
        reveal="",
        hidden="",
        ai="ai assistant chatbot llm gpt chatgpt claude copilot language_model",
        owner="my your our his her their executive personal administrative teaching research"
        " lab medical dental legal store shop sales office manager* professor* director* coach*"
        " editor*",
        modal="must should shall has_to have_to needs_to need_to is_required_to are_required_to"
        " is_instructed_to",
        act="send* forward* transfer* e-mail* email* upload* post* share* wire* pay* delete*"
        " remove* invite* leak* exfiltrat* disclos* reveal*",
        framing=r"(?!)",
        frame_anchors="",
    ),
    Lexicon(
        name="es",
        script=None,
        ignore="ignor* olvid* omit* descart* haz_caso_omiso pasa_por_alto",
        instructions="instruccion* indicacion* regla* directriz* directrices orden* prompt*",
        previous="anterior* previa* previo* todas todos todo tus sus arriba precedente* del_sistema"
        " original* iniciales",
        negation="no nunca jamás",
        reveal="revela* muestra* muéstra* dime di repite* imprime* escribe* enseña*",
        hidden="sistema tus tu ocult* inicial* original* secret*",
        ai="asistente ia chatbot modelo_de_lenguaje",
        owner="mi tu su nuestro nuestra de_dirección administrativ* personal ejecutiv*",
        modal="debe deben debes tiene_que tienes_que necesita* ha_de",
        act="envi* enví* reenví* reenvi* transfier* transferir* comparte* compartir* sube* subir*"
        " publica* borra* borrar* elimina* paga* pagar*",
        framing=r"mensaje importante|instrucciones importantes|antes de (?:continuar|responder"
        r"|contestar|seguir|proceder|resumir|completar|hacer (?:esto|eso|nada|cualquier))"
        r"|en (?:lugar|vez) de (?:responder|hacer|completar|resolver) (?:la|tu)",
        frame_anchors="mensaje instrucciones antes lugar vez",
        function_words="el los las del que por para con una es está y muy pero como este esta"
        " hola gracias",
    ),
    Lexicon(
        name="fr",
        script=None,
        ignore="ignor* oubli* néglige* outrepass* fais_abstraction passe_outre",
        instructions="instruction* consigne* règle* directive* prompt*",
        previous="précédent* antérieur* toutes tous vos tes ci-dessus du_système initial* origin*",
        negation="ne n' n’ pas jamais",
        reveal="révèle* revele* montre* affiche* donne-moi dis-moi répète* repete* écris* recopie*",
        hidden="système systeme tes vos ton votre caché* initial* origin* secret*",
        ai="assistant ia chatbot modèle_de_langage",
        owner="mon ma ton ta votre notre son sa leur de_direction administrati* commercial*"
        " parlementaire*",
        modal="doit doivent dois devez devra il_faut",
        act="envoi* envoy* transfèr* transfér* transmet* transmettre partage* téléverse*"
        " télécharge* publie* supprime* efface* paie* payer* vire*",
        framing=r"message important|instructions importantes|avant (?:de |d'|d’)(?:continuer"
        r"|repondre|poursuivre|proceder|commencer|resumer|faire quoi que ce soit|accomplir"
        r"|executer)|au lieu de (?:repondre|faire|traiter|realiser)",
        frame_anchors="message instructions avant lieu",
        function_words="le les des du et est une pour dans que qui ne pas vous tu je nous avec"
        " sur mais merci",
    ),
    Lexicon(
        name="de",
        script=None,
        ignore="ignorier* vergiss* vergesst vergessen missacht* überspring* verwirf verwerfen",
        instructions="anweisung* instruktion* regel* vorgabe* richtlinie* befehl* prompt*"
        " systemprompt* systemanweisung*",
        previous="vorherig* früher* bisherig* alle allen obig* deine deinen ihre ihren system*"
        " ursprünglich* vorangegangen* vorige*",
        negation="nicht nie kein* niemals",
        reveal="zeig* verrat* nenn* wiederhol* gib_mir gib* schreib*",
        hidden="system* deine deinen ihre ihren versteckt* geheim* ursprünglich* initial*",
        ai="assistent ki chatbot sprachmodell ki-assistent",
        owner="mein meine dein ihr unser sein der_geschäftsführung der_leitung",
        modal="musst muss müssen müsst sollst soll sollen hast_zu",
        act="send* schick* weiterleit* leite* überweis* teil* lad* hochlad* lösch* poste*"
        " veröffentlich*",
        framing=r"wichtige (?:nachricht|mitteilung|anweisung)|bevor (?:du|sie) (?:\w+ ){0,2}"
        r"(?:antwortest|antworten|fortfahrst|fortfahren|weitermachst|weitermachen|beginnst"
        r"|zusammenfasst|loslegst)|(?:an)?statt (?:die|deine|ihre) (?:aufgabe|frage)",
        frame_anchors="wichtige bevor statt anstatt",
        function_words="der das und ist nicht mit sie ich du den dem ein eine zu auf bitte"
        " danke auch",
    ),
    Lexicon(
        name="pt",
        script=None,
        ignore="ignor* esqueç* esquec* desconsider* despreze* descart*",
        instructions="instruç* instruc* regra* diretriz* diretrizes orientaç* comando* prompt*",
        previous="anterior* prévia* previa* todas todos suas tuas acima do_sistema original*"
        " iniciais",
        negation="não nao nunca jamais",
        reveal="revel* mostr* diga* diz* repit* imprim* escrev*",
        hidden="sistema suas tuas sua tua ocult* inicia* original* secret*",
        ai="assistente ia chatbot modelo_de_linguagem",
        owner="meu minha seu sua nosso nossa administrativ* de_direção executiv*",
        modal="deve devem tem_que precisa*",
        act="envi* encaminh* transfir* compartilh* public* apag* exclu* pag*",
        framing=r"mensagem importante|instrucoes importantes|antes de (?:continuar|responder"
        r"|prosseguir|seguir|resumir|completar|fazer qualquer)|em vez de (?:responder|fazer"
        r"|completar)",
        frame_anchors="mensagem instruções antes vez",
        function_words="os um uma que não com para do da dos das em é você obrigado",
    ),
    Lexicon(
        name="it",
        script=None,
        ignore="ignora* dimentica* trascura* tralascia*",
        instructions="istruzion* regol* direttiv* indicazion* prompt*",
        previous="precedent* tutte tutti tue sue sopra del_sistema original* iniziali",
        negation="non mai",
        reveal="rivela* mostra* dimmi ripeti* stampa* scrivi*",
        hidden="sistema tue tuo sue nascost* inizial* original* segret*",
        ai="assistente ia chatbot modello_linguistico",
        owner="mio mia tuo tua suo sua nostro nostra di_direzione amministrativ*",
        modal="deve devono devi",
        act="invia* inoltra* trasferisci* condividi* carica* pubblica* elimina* cancella* paga*",
        framing=r"messaggio importante|istruzioni importanti|prima di (?:continuare|rispondere"
        r"|procedere|proseguire|riassumere)|invece di (?:rispondere|svolgere|completare)",
        frame_anchors="messaggio istruzioni prima invece",
        function_words="il gli di che è non per con una sono della del anche grazie",
    ),
    Lexicon(
        name="nl",
        script=None,
        ignore="negeer* vergeet* negeren vergeten",
        instructions="instructie* regel* opdracht* richtlijn* prompt*",
        previous="vorige eerdere alle bovenstaande je jouw uw systeem*",
        negation="niet nooit geen",
        reveal="toon* laat_zien herhaal* geef* onthul*",
        hidden="systeem* je jouw uw verborgen* oorspronkelijk* geheim*",
        ai="assistent ai chatbot taalmodel",
        owner="mijn jouw zijn haar onze",
        modal="moet moeten",
        act="stuur* verstuur* doorsturen verzend* deel* upload* verwijder* betaal* maak_over",
        framing=r"belangrijk bericht|belangrijke (?:mededeling|instructie)|voordat (?:je|u)"
        r" (?:\w+ )?(?:verdergaat|doorgaat|antwoordt|begint|samenvat)",
        frame_anchors="belangrijk belangrijke voordat",
        function_words="het een en van ik je niet dat zijn voor met ook bedankt",
    ),
    Lexicon(
        name="pl",
        script=None,
        ignore="zignoruj* ignoruj* zapomnij* pomiń* pomin*",
        instructions="instrukcj* polecen* zasad* reguł* regul* wytyczn* prompt*",
        previous="poprzedni* wszystk* wcześniejsz* powyższ* systemow* twoje swoje",
        negation="nie nigdy",
        reveal="pokaż* pokaz* ujawnij* powtórz* powtorz* wypisz* podaj*",
        hidden="systemow* twoje swoje ukryt* początkow* tajn*",
        ai="asystent* ai si chatbot* model_językowy",
        owner="mój moja twój twoja nasz",
        modal="musi musisz powinien powinieneś należy",
        act="wyślij* wyslij* prześlij* przeslij* przekaż* przekaz* udostępnij* usuń* usun*"
        " przelej*",
        framing=r"wazna wiadomosc|wazne instrukcje|zanim (?:odpowiesz|kontynuujesz|przejdziesz"
        r"|zaczniesz)",
        frame_anchors="ważna ważne zanim",
        function_words="się nie jest że jak dla czy tak dzięki",
    ),
    Lexicon(
        name="tr",
        script=None,
        # Negative imperatives (`unutma`, `yok sayma`) are other words: left out by the ending.
        ignore="yok_say yok_sayın görmezden_gel* unut unutun ihmal_et* dikkate_alma",
        instructions="talimat* kural* yönerge* komut* istem* prompt*",
        previous="önceki tüm bütün yukarıdaki sistem* senin sizin",
        negation="değil asla",
        reveal="göster* söyle* yazdır* tekrarla* açıkla*",
        hidden="sistem* senin sizin gizli* ilk*",
        ai="asistan* yapay_zeka chatbot* dil_modeli",
        owner="benim senin bizim onun",
        modal="zorunda* gerek* mecbur* malı malısın meli melisin",
        act="gönder* ilet* aktar* paylaş* yükle* sil* öde*",
        framing=r"onemli (?:mesaj|not|talimat)|(?:devam etmeden|yanit vermeden|cevap vermeden"
        r"|cevaplamadan|yanitlamadan) once",
        frame_anchors="önemli devam yanıt cevap cevaplamadan yanıtlamadan",
        function_words="ve bir bu için ile değil çok ama lütfen",
    ),
    Lexicon(
        name="id",
        script=None,
        ignore="abaikan* lupakan* acuhkan* hiraukan",
        instructions="instruksi* perintah* aturan* petunjuk* arahan* prompt*",
        previous="sebelumnya semua seluruh di_atas sistem anda kamu",
        negation="jangan tidak tak",
        reveal="tunjukkan* tampilkan* ungkapkan* ulangi* beritahu* sebutkan*",
        hidden="sistem anda kamu tersembunyi rahasia awal",
        ai="asisten ai chatbot model_bahasa",
        owner="saya kami",
        modal="harus wajib perlu",
        act="kirim* teruskan* transfer* bagikan* unggah* hapus* bayar* mengirim* meneruskan"
        " membagikan mengunggah menghapus membayar mentransfer",
        framing=r"pesan penting|instruksi penting|sebelum (?:anda |kamu )?(?:melanjutkan"
        r"|menjawab|membalas|memulai)",
        frame_anchors="pesan instruksi sebelum",
        function_words="dan yang ke dari ini itu untuk dengan tidak saya anda kamu",
    ),
    Lexicon(
        name="vi",
        script=None,
        ignore="bỏ_qua phớt_lờ quên",
        instructions="hướng_dẫn chỉ_dẫn chỉ_thị quy_tắc lệnh prompt*",
        previous="trước_đó trước tất_cả mọi hệ_thống ban_đầu",
        negation="không chớ",
        reveal="hiển_thị tiết_lộ cho_tôi_xem lặp_lại in_ra",
        hidden="hệ_thống của_bạn ẩn ban_đầu bí_mật",
        ai="trợ_lý ai chatbot",
        owner="của_tôi",
        modal="phải cần",
        act="gửi chuyển_tiếp chuyển xóa chia_sẻ tải_lên",
        framing=r"thong diep quan trong|tin nhan quan trong|truoc khi (?:ban )?(?:tiep tuc"
        r"|tra loi)",
        frame_anchors="thông tin trước",
        function_words="và của là có các những cho không tôi bạn",
    ),
    Lexicon(
        name="ru",
        script="cyrillic",
        ignore="игнорир* проигнорир* забудь* забудьте забыть пренебреги* отбрось* отмени*"
        " не_обращай_внимания не_обращайте_внимания",
        instructions="инструкци* указани* правил* команд* промпт* директив* установк*",
        previous="предыдущ* прежн* все всё всех ваши твои свои системн* выше исходн* ранее прошл*",
        negation="не нельзя никогда",
        reveal="покажи* раскрой* выведи* повтори* скажи* напиши* перечисли*",
        hidden="системн* твои ваши свои скрыт* исходн* секретн* начальн*",
        ai="ассистент* помощник* ии чат-бот* нейросет* языков*_модел*",
        owner="мой моя ваш ваша твой твоя наш наша его её",
        modal="должен должна должны обязан* нужно надо необходимо следует",
        act="отправ* перешл* пересл* передай* передать загрузи* удали* опубликуй* переведи*"
        " перевести",
        framing=r"важное сообщение|важные инструкции|прежде чем (?:продолжить|ответить|отвечать"
        r"|выполнить)|перед тем как (?:продолжить|ответить)|перед ответом|вместо того чтобы"
        r" (?:ответить|выполнить)",
        frame_anchors="важное важные прежде перед вместо",
    ),
    Lexicon(
        name="zh",
        script="han",
        ignore="忽略 无视 無視 忘记 忘記 忘掉 忽视 忽視 不要理会 不理会 抛开 拋開",
        instructions="指令 指示 说明 說明 提示 规则 規則 命令 指引 要求 设定 設定",
        previous="之前 以前 先前 上面 上述 所有 全部 一切 你的 您的 系统 系統 原来 原始 原有",
        negation="不要 请勿 請勿 切勿 不得 不能 不可 勿",
        reveal="显示 顯示 告诉我 告訴我 输出 輸出 重复 重複 透露 打印 给我看 展示 泄露 洩露 列出",
        hidden="系统 系統 你的 您的 隐藏 隱藏 初始 原始 秘密",
        ai="助手 助理 ai 人工智能 智能体 语言模型 語言模型",
        owner="我的 我们的",
        modal="必须 必須 务必 務必 一定要 需要 应该 應該",
        act="发送 發送 转发 轉發 发给 發給 发到 传给 上传 上傳 删除 刪除 转账 轉賬 汇款 匯款 分享",
        framing=r"重要(?:消息|信息|通知|指示)|在(?:你|您)?(?:继续|繼續|回答|回复|回覆|开始|開始"
        r"|执行|執行)(?:之前|以前)|(?:回答|回复|继续|繼續)之前|而不是(?:回答|完成)",
        frame_anchors="重要 之前 以前 而不是",
    ),
    Lexicon(
        name="ja",
        script="kana",
        ignore="無視 忘れ 破棄",
        instructions="指示 命令 指令 ルール プロンプト 規則 設定 ガイドライン",
        previous="以前 前の これまで 上記 上の すべて 全て 全部 あなたの システム 元の 最初の",
        negation="ないで ないでください しない 禁止",
        reveal="教えて 見せて 表示 出力 繰り返 開示 書き出",
        hidden="システム あなたの 隠された 隠し 最初の 元の 秘密",
        ai="アシスタント ai 人工知能 チャットボット 言語モデル",
        owner="私の 弊社の",
        modal="必ず なければならない なければなりません 必要があります してください",
        act="送信 転送 送って 送る 送付 共有 アップロード 削除 振り込 送金",
        framing=r"重要な(?:メッセージ|お知らせ|指示)|(?:続ける|回答する|答える|返答する|進む"
        r"|始める|作業する)前に|その前に、?まず",
        frame_anchors="重要な 前に",
    ),
    Lexicon(
        name="ko",
        script="hangul",
        ignore="무시 잊어 잊고 잊으",
        instructions="지시 지침 명령 규칙 프롬프트 설정",
        previous="이전 앞의 위의 모든 기존 시스템 당신의 너의 처음",
        negation="말고 마세요 마십시오 마라 않",
        reveal="보여 알려 출력 공개 반복 말해",
        hidden="시스템 당신의 너의 숨겨진 초기 원래 비밀",
        ai="어시스턴트 비서 인공지능 ai 챗봇 언어_모델",
        owner="내 나의 저의 우리",
        modal="해야 하세요 해주세요 반드시",
        act="보내 전송 전달 공유 업로드 삭제 송금 이체",
        framing=r"중요한 (?:메시지|알림|지시)|(?:계속하기|답변하기|대답하기|진행하기|응답하기"
        r"|시작하기) 전에",
        frame_anchors="중요한 전에",
    ),
    Lexicon(
        name="ar",
        script="arabic",
        ignore="تجاهل تجاهلي تجاهلوا انس انسى انسي أهمل اهمل تغاضى",
        instructions="تعليمات التعليمات الأوامر أوامر اوامر القواعد قواعد التوجيهات توجيهات"
        " الإرشادات",
        previous="السابقة سابقة جميع كل أعلاه اعلاه النظام الأصلية",
        negation="_لا_ _لم_ _لن_",
        reveal="اكشف أظهر اظهر اعرض اطبع كرر أخبرني اخبرني",
        hidden="النظام نظامك الخاصة المخفية السرية الأولية",
        ai="المساعد مساعد الذكاء_الاصطناعي",
        owner="مساعدي مساعدك",
        modal="يجب عليك_أن ينبغي",
        act="أرسل ارسل إرسال ارسال يرسل ترسل حول حوّل يحول تحول انقل ينقل شارك احذف يحذف ارفع"
        " ادفع يدفع",
        framing=r"رسالة (?:مهمة|هامة)|قبل (?:أن )?(?:تتابع|تستمر|تجيب|ترد|تبدأ|المتابعة|الإجابة"
        r"|الرد)",
        frame_anchors="رسالة قبل",
    ),
    Lexicon(
        name="hi",
        script="indic",
        ignore="अनदेखा नज़रअंदाज़ नजरअंदाज भूल_जाओ भूल_जाएं भूल_जाइए",
        instructions="निर्देश नियम आदेश प्रॉम्प्ट",
        previous="पिछल पूर्व सभी सारे ऊपर सिस्टम अपने आपके",
        negation="मत _न_ नहीं",
        reveal="बताओ बताएं बताइए दिखाओ दिखाएं दिखाइए प्रकट दोहराएं",
        hidden="सिस्टम आपके तुम्हारे छिपे गुप्त प्रारंभिक",
        ai="सहायक एआई ai",
        owner="मेरा मेरे हमारा",
        modal="चाहिए होगा अवश्य",
        act="भेज फॉरवर्ड साझा अपलोड हटा ट्रांसफर",
        framing=r"महत्वपूर्ण (?:संदेश|सूचना|निर्देश)|(?:जारी रखने|जवाब देने|उत्तर देने|आगे बढ़ने)"
        r" से पहले",
        frame_anchors="महत्वपूर्ण पहले",
    ),
)
_COMPILED = tuple(_Compiled(lex) for lex in LEXICONS)
_LATIN_BY_KEY: dict[bytes, list[tuple[int, _Anchor]]] = {}
for _index, _c in enumerate(_COMPILED):
    if _c.latin:
        for _anchor in _c.anchors:
            _LATIN_BY_KEY.setdefault(_key(_anchor.text), []).append((_index, _anchor))
_LATIN_KEYS = frozenset(_LATIN_BY_KEY)
