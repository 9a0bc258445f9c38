"""`builtin:tales`: short children's stories generated from a seeded grammar (offline, identical everywhere).

Each story introduces two characters, each with an object of a colour, a place and a pet, then
refers back to them: which child owns which object, what colour it was, where they went. The first
mention of each entity is a free choice; every later mention can only be predicted by finding the
earlier one in context (associative recall through attention), which is where learned and frozen
Q/K differ. The text is produced by `random.Random(seed)`, so it is the same on every Python
version and machine (unlike the standard-library corpus).
"""

from __future__ import annotations

import random

GIRLS = (
    "Mia",
    "Lily",
    "Emma",
    "Zoe",
    "Anna",
    "Lucy",
    "Sara",
    "Nora",
    "Ella",
    "Ruby",
    "Rosa",
    "Ivy",
    "Maya",
    "Lena",
    "Alice",
    "Hana",
    "Jade",
    "Kira",
    "Luna",
    "Sofia",
)
BOYS = (
    "Tom",
    "Ben",
    "Sam",
    "Leo",
    "Max",
    "Jack",
    "Finn",
    "Noah",
    "Owen",
    "Liam",
    "Omar",
    "Hugo",
    "Theo",
    "Eli",
    "Jonas",
    "Kai",
    "Ravi",
    "Milo",
    "Oscar",
    "Ezra",
)
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "pink", "white", "black", "brown", "gold", "silver")
OBJECTS = (
    "ball",
    "kite",
    "hat",
    "box",
    "cup",
    "book",
    "drum",
    "boat",
    "sock",
    "key",
    "bell",
    "shell",
    "rock",
    "flag",
    "car",
    "doll",
    "spoon",
    "coat",
    "lamp",
    "bag",
)
PETS = ("dog", "cat", "bird", "frog", "duck", "fish", "bunny", "mouse", "puppy", "kitten")
PET_NAMES = ("Spot", "Fluffy", "Pip", "Bingo", "Coco", "Daisy", "Buddy", "Sunny", "Tiny", "Patch", "Biscuit", "Pebble")
PLACES = ("park", "garden", "beach", "forest", "farm", "lake", "hill", "school", "market", "river", "zoo", "library")
FEELINGS = ("happy", "sad", "excited", "tired", "scared", "proud", "surprised", "calm")
WEATHER = ("sunny", "rainy", "windy", "cold", "warm", "cloudy")
ACTIVITIES = ("play", "run", "sing", "jump", "read", "draw", "dance", "swim")


def _story(rng: random.Random) -> str:
    """One story: two children, their objects, a pet and a place, referred back to later."""
    girl, boy = rng.choice(GIRLS), rng.choice(BOYS)
    kids = [(girl, "she", "her"), (boy, "he", "his")]
    rng.shuffle(kids)
    (a, a_she, a_her), (b, b_she, b_her) = kids
    col_a, col_b = rng.sample(COLOURS, 2)
    obj_a, obj_b = rng.sample(OBJECTS, 2)
    pet, pet_name = rng.choice(PETS), rng.choice(PET_NAMES)
    place, place2 = rng.sample(PLACES, 2)
    feel, weather, act = rng.choice(FEELINGS), rng.choice(WEATHER), rng.choice(ACTIVITIES)
    cap = str.capitalize
    s = [
        rng.choice(
            [
                f"Once upon a time, there was a child named {a}.",
                f"There once was a little kid called {a}.",
                f"One {weather} day, a child named {a} woke up early.",
            ]
        ),
        f"{a} had a {col_a} {obj_a}.",
        rng.choice(
            [
                f"{a} loved the {col_a} {obj_a} very much.",
                f"{cap(a_her)} {obj_a} was {col_a} and shiny.",
                f"Every day, {a} took the {obj_a} everywhere.",
            ]
        ),
        f"{a} had a friend named {b}, and {b} had a {col_b} {obj_b}.",
        f"{b} also had a {pet} named {pet_name}.",
        rng.choice(
            [
                f"One day, {a} and {b} went to the {place} to {act}.",
                f"It was {weather}, so {a} and {b} walked to the {place}.",
                f"In the morning, {b} asked {a} to come to the {place}.",
            ]
        ),
        rng.choice(
            [
                f"{pet_name} the {pet} came with them.",
                f"{b} brought {pet_name} along.",
                f"{pet_name} ran after them all the way to the {place}.",
            ]
        ),
        rng.choice(
            [
                f"At the {place}, {a} dropped the {col_a} {obj_a} and could not find it.",
                f"At the {place}, the {obj_a} of {a} fell into a hole.",
                f"At the {place}, a big wind took the {col_a} {obj_a} away from {a}.",
            ]
        ),
        f"{a} felt {feel}.",
        rng.choice(
            [
                f'"Do not worry," said {b}. "{pet_name} will help us find your {obj_a}."',
                f'"I will help you," said {b}. "Let us look for the {col_a} {obj_a}."',
                f"{b} gave {a} the {col_b} {obj_b} to hold while they looked.",
            ]
        ),
        rng.choice(
            [
                f"{pet_name} the {pet} sniffed the ground and found the {col_a} {obj_a}.",
                f"After a long time, {b} saw something {col_a} near the {place2} path. It was the {obj_a}!",
                f"Then {pet_name} barked. The {col_a} {obj_a} was under a tree.",
            ]
        ),
        f"{a} was so happy to have the {obj_a} back.",
        rng.choice(
            [
                f'"Thank you, {b}, and thank you, {pet_name}," said {a}.',
                f"{a} hugged {b} and gave {pet_name} a treat.",
                f"{a} let {b} play with the {col_a} {obj_a} too.",
            ]
        ),
        rng.choice(
            [
                f"Then {a} and {b} went home from the {place}. {b} held the {col_b} {obj_b}, and "
                f"{a} held the {col_a} {obj_a}.",
                f"When the sun went down, {a_she} went home with the {col_a} {obj_a}, and {b} "
                f"went home with {pet_name}.",
                f"From that day on, {a} never lost the {col_a} {obj_a} again, and {b} always "
                f"kept {b_her} {col_b} {obj_b} close.",
            ]
        ),
    ]
    if rng.random() < 0.5:
        s.insert(5, f"{cap(b_she)} liked to {act} with {pet_name} in the {place2}.")
    return " ".join(s)


def tales(n: int = 8000, seed: int = 0) -> list[str]:
    """`n` distinct stories from the grammar seeded by `seed` (deterministic)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        out.setdefault(_story(rng))
    return list(out)
