"""LoCoMo conversations as memq events, and evidence ids normalised
(see ../shared/data/README.md for the format and its quirks)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from memq.contracts.schemas import Event, Message, TextPart

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SCORED = (1, 2, 3, 4)  # adversarial questions are usually left out of scores


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    session: str
    timestamp: float


@dataclass
class Question:
    question: str
    category: int
    evidence: list[str]  # dia ids that exist


@dataclass
class Conversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: dict[str, list[Turn]] = field(default_factory=dict)  # "session_1" → turns, in order
    questions: list[Question] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return [t for turns in self.sessions.values() for t in turns]

    def event_id(self, dia_id: str) -> str:
        return f"{self.sample_id}:{dia_id}"

    def event(self, turn: Turn) -> Event:
        # speaker_a plays the user, speaker_b the assistant: roles only matter
        # for "the last user message" of a context.
        role = "user" if turn.speaker == self.speaker_a else "assistant"
        return Event(
            id=self.event_id(turn.dia_id),
            author=turn.speaker,
            message=Message(role=role, parts=[TextPart(text=turn.text)]),
            timestamp=turn.timestamp,
        )


def parse_date(text: str) -> float:
    """ "1:56 pm on 8 May, 2023" → a UTC timestamp."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def normalise_evidence(raw: list[str], known: set[str]) -> list[str]:
    out: list[str] = []
    for item in raw:
        for token in re.split(r"[;\s]+", item):
            token = token.replace("D:", "D").strip()
            m = re.fullmatch(r"D(\d+):0*(\d+)", token)
            if m:
                dia = f"D{int(m.group(1))}:{int(m.group(2))}"
                if dia in known and dia not in out:
                    out.append(dia)
    return out


def load(path: Path, limit: int | None = None) -> list[Conversation]:
    data = json.loads(Path(path).read_text())
    conversations = []
    for item in data[:limit]:
        conv = item["conversation"]
        c = Conversation(item["sample_id"], conv["speaker_a"], conv["speaker_b"])
        keys = sorted(
            (k for k in conv if re.fullmatch(r"session_\d+", k) and isinstance(conv[k], list)),
            key=lambda k: int(k.split("_")[1]),
        )
        for key in keys:
            ts = parse_date(conv[f"{key}_date_time"])
            turns = []
            for i, t in enumerate(conv[key]):
                text = t["text"]
                if t.get("blip_caption"):
                    text = f"{text} [shares an image: {t['blip_caption']}]"
                # Turns of a session get increasing times, a minute apart.
                turns.append(Turn(t["dia_id"], t["speaker"], text, key, ts + 60 * i))
            c.sessions[key] = turns
        known = {t.dia_id for t in c.turns}
        for qa in item["qa"]:
            evidence = normalise_evidence(qa.get("evidence", []), known)
            if evidence:
                c.questions.append(Question(qa["question"], int(qa["category"]), evidence))
        conversations.append(c)
    return conversations
