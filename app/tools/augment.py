"""Templated prompts for the categories the public sets lack.

Instruction words ("summarize", "rewrite", "write a poem") must outweigh topic
words: a summary request about physics is `extraction`, not `science`. So
each template is filled with passages and topics from every domain.
"""

from __future__ import annotations

import random

PASSAGES = [
    "The council approved a new budget on Monday that raises school funding by 4 percent "
    "while cutting road maintenance.",
    "Photosynthesis converts light energy into chemical energy stored in glucose, releasing "
    "oxygen as a by-product.",
    "In 1869 the Suez Canal opened, cutting the sea route between Europe and Asia by "
    "thousands of kilometres.",
    "Our quarterly revenue grew 12% to $4.2M, driven by subscriptions, while churn rose to "
    "3.1% in the enterprise segment.",
    "Patient reports mild headache and fatigue for three days; temperature 37.9 C; no known "
    "allergies; prescribed rest and fluids.",
    "The function retries the request three times with exponential backoff before raising a "
    "TimeoutError to the caller.",
    "Dear team, the offsite moves to May 14. Please book travel by Friday and send dietary "
    "needs to Priya.",
    "The hotel was clean and the staff friendly, but the breakfast was cold and the wifi kept "
    "dropping.",
    "Interest rates rose for the third time this year as the central bank tried to bring "
    "inflation back to its 2% target.",
    "A black hole forms when a massive star collapses under its own gravity at the end of "
    "its life.",
    "Sam: can you ship it today? Lee: only if QA signs off by 3pm. Sam: ok, I'll ping them.",
    "Order #48213 - 2x USB-C cable $9.99, 1x charger $24.50, shipping $5.00, due 2024-07-01.",
]
TOPICS = [
    "the ocean", "a rainy Monday", "my first car", "friendship", "black holes", "the city at "
    "night", "a lost cat", "autumn", "coffee", "the Roman Empire", "machine learning", "home",
    "a robot who learns to paint", "climbing a mountain", "my grandmother's kitchen",
    "interest rates", "a startup launch", "the moon landing",
]
LANGUAGES = ["Python", "JavaScript", "TypeScript", "Rust", "Go", "Java", "C++", "C#", "SQL",
             "Bash", "Kotlin", "PHP", "Ruby", "Swift"]
CODE_TASKS = [
    "read a JSON file", "parse command line arguments", "sort a list of objects by a field",
    "make an HTTP GET request", "write a unit test", "remove duplicates from an array",
    "connect to a database", "handle exceptions properly", "run tasks in parallel",
    "reverse a linked list", "implement a stack", "read environment variables",
    "format a date as ISO 8601", "split a string by commas", "write a class with a "
    "constructor", "serialize an object to JSON", "debounce a function", "hash a password",
]
CODE_ERRORS = [
    "KeyError: 'id'", "undefined is not a function", "segmentation fault",
    "NullPointerException", "borrow of moved value", "cannot find module 'express'",
    "syntax error near unexpected token", "permission denied (publickey)",
    "connection refused on port 5432", "ModuleNotFoundError: No module named 'numpy'",
]


def _writing(rng: random.Random) -> str:
    form = rng.choice(["poem", "short story", "haiku", "song", "limerick", "blog post",
                       "speech", "letter", "toast", "fable", "scene", "monologue"])
    topic = rng.choice(TOPICS)
    return rng.choice([
        f"Write a {form} about {topic}.",
        f"Can you write me a {form} about {topic}?",
        f"Compose a {rng.choice(['funny', 'sad', 'heartfelt', 'dark', 'whimsical'])} {form} "
        f"about {topic}.",
        f"Rewrite this to sound more {rng.choice(['formal', 'casual', 'friendly', 'confident'])}"
        f": {rng.choice(PASSAGES)}",
        f"Paraphrase the following in plain English: {rng.choice(PASSAGES)}",
        f"Act as a {rng.choice(['pirate', 'wizard', 'detective', 'knight', 'tour guide'])} "
        f"and tell me about {topic}.",
        f"Let's role-play. You are a {rng.choice(['shopkeeper', 'ship captain', 'vampire'])}"
        f" and I just walked in.",
        f"Write a catchy tagline for a product related to {topic}.",
        f"Make this sentence more vivid: {rng.choice(PASSAGES)}",
    ])


def _extraction(rng: random.Random) -> str:
    p = rng.choice(PASSAGES)
    things = rng.choice(["names", "dates", "numbers", "amounts", "key facts", "action items",
                         "entities", "places", "complaints"])
    return rng.choice([
        f"Summarize this in one sentence: {p}",
        f"Summarize the following text:\n\n{p}",
        f"TL;DR: {p}",
        f"Extract all {things} from the text below.\n\n{p}",
        f"List the {things} mentioned here: {p}",
        f"From this text, return a JSON object with the {things}: {p}",
        f"What is the sentiment of this text? {p}",
        f"Give me the key points of the following as bullets: {p}",
        f"Based only on the text below, what happened?\n{p}",
        f"Classify this message into a category: {p}",
    ])


def _code(rng: random.Random) -> str:
    lang, task = rng.choice(LANGUAGES), rng.choice(CODE_TASKS)
    return rng.choice([
        f"How do I {task} in {lang}?",
        f"Write {lang} code to {task}.",
        f"Show me how to {task} using {lang}.",
        f"I get this error in my {lang} code: {rng.choice(CODE_ERRORS)}. How do I fix it?",
        f"What's the best way to {task} in {lang}?",
        f"Write a {lang} function to {task}.",
    ])


def _chat(rng: random.Random) -> str:
    return rng.choice([
        rng.choice(["hi", "hello", "hey", "yo", "hiya", "good evening", "morning!"])
        + rng.choice(["", "!", " :)", " there", ", how are you?"]),
        rng.choice(["thanks", "thank you", "cheers", "ok", "cool", "great", "perfect"])
        + rng.choice(["", "!", " a lot", ", that helps", " :)"]),
        "I'm " + rng.choice(["tired", "happy", "bored", "stressed", "excited", "sad"])
        + rng.choice(["", " today", " right now", " lol"]),
        rng.choice(["what's your name?", "how old are you?", "where are you from?",
                    "do you have feelings?", "can we be friends?", "what do you like?"]),
        rng.choice(["bye", "see ya", "talk later", "good night", "gotta go"]),
    ])


GENERATORS = {"writing": _writing, "extraction": _extraction, "code": _code, "chat": _chat}


def templated(per_category: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for cat, gen in GENERATORS.items():
        seen: set[str] = set()
        for _ in range(per_category * 5):
            text = gen(rng)
            if text not in seen:
                seen.add(text)
                out.append((cat, text))
            if len(seen) >= per_category:
                break
    return out
