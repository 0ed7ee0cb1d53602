"""Four hand-made examples of three senses of "bank": a sense index fitted in a second (fitting
on WordNet reads all of it), shared by test_wsd.py and the catalog's shared inputs."""

from bertjax.wsd.wordnet import Example, Sense


def sense(lemma, pos, number, definition=""):
    return Sense(f"{lemma}.{pos}.{number:02d}", lemma, pos, f"{number:08d}", definition)


RIVER, MONEY, TILT = sense("bank", "n", 1), sense("bank", "n", 2), sense("bank", "v", 1)
HAND_MADE = [
    Example(tuple("he sat on the bank of the river".split()), 4, RIVER),
    Example(tuple("the muddy bank of the stream".split()), 2, RIVER),
    Example(tuple("she opened an account at the bank".split()), 6, MONEY),
    Example(tuple("the pilot had to bank the aircraft".split()), 4, TILT),
]
