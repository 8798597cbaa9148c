#!/usr/bin/env python3
"""Training prompts for the SmolLM2-135M-Instruct EAGLE-3 head: instruction templates x topic lists.

Every prompt is built here from hand-written templates and word lists (no prompt is copied from
any benchmark). Categories mirror the kinds of requests an instruction model gets (writing,
roleplay, reasoning, math, coding, extraction, STEM, humanities, explanations, summaries,
translations, advice, comparisons, lists, short factual questions). The prompts are deduplicated,
shuffled with a fixed seed and written as JSON lines {"id", "category", "prompt"}.

Disjointness from the evaluation sets: every prompt is checked against every turn of every
configs/prompts/*.jsonl file (Spec-Bench questions included): no prompt equals an evaluation
turn, is contained in one, or contains one (case-insensitive, whitespace-normalised); the
counts are printed and the script fails on any hit. scripts/train_eagle3.py repeats the check.

    python3 models/eagle3-smollm2/make_prompts.py --out models/eagle3-smollm2/prompts.jsonl
"""

import argparse
import collections
import glob
import itertools
import json
import random
import re

PLACES = ["Lisbon", "Kyoto", "a small fishing village in Norway", "the Atacama Desert", "Patagonia", "Marrakech",
          "a mountain town in Nepal", "Vancouver Island", "the Scottish Highlands", "Cape Town", "Hanoi",
          "the Amalfi Coast", "Iceland's south coast", "Buenos Aires", "a national park in Kenya", "Tallinn",
          "the Greek island of Crete", "Montreal in winter", "rural Tuscany", "Seoul", "the Canadian Rockies",
          "Istanbul", "a lake district in Chile", "New Zealand's Fiordland", "Prague", "Oaxaca", "Bali's highlands",
          "the Faroe Islands", "Mongolia's steppe", "Quebec City", "Zanzibar", "Copenhagen", "the Dolomites"]
OBJECTS = ["an old pocket watch", "a lighthouse", "a forgotten library", "a broken violin", "a paper map",
           "a mysterious key", "an abandoned train station", "a robot gardener", "a talking cat", "a snow globe",
           "a letter never sent", "a stolen painting", "a rainy bus stop", "a tiny bookshop", "an underground river",
           "a family recipe", "a lost umbrella", "a clock tower", "a hidden garden", "a time capsule",
           "a chess tournament", "a night market", "an old photograph", "a desert oasis", "a space elevator"]
CHARACTERS = ["a retired astronaut", "a shy baker", "a young inventor", "a grumpy lighthouse keeper",
              "a street musician", "a detective who is afraid of the dark", "a marine biologist", "a village doctor",
              "a teenage chess prodigy", "a traveling librarian", "an elderly gardener", "a nervous pilot",
              "a robot learning to paint", "a cartographer", "a beekeeper", "a ghost who misses music",
              "a firefighter on her last shift", "a translator at a peace summit", "a clockmaker", "a farmer on Mars"]
TOPICS = ["climate change", "remote work", "social media", "urban gardening", "electric cars", "public libraries",
          "space exploration", "artificial intelligence", "renewable energy", "online education", "video games",
          "fast fashion", "volunteering", "sleep", "meditation", "recycling", "public transportation",
          "minimalism", "learning a second language", "team sports", "coffee culture", "homeschooling",
          "the four-day work week", "smartphones in classrooms", "plant-based diets", "tourism",
          "cybersecurity", "bicycles in cities", "museums", "open-source software", "personal finance",
          "board games", "journaling", "podcasts", "water conservation", "citizen science", "aging populations"]
AUDIENCES = ["a ten-year-old", "a high school student", "a busy parent", "a new employee", "a retiree",
             "a beginner", "a university freshman", "a small business owner", "a curious tourist", "a nurse"]
SCIENCE = ["photosynthesis", "plate tectonics", "the water cycle", "black holes", "vaccines", "DNA replication",
           "the greenhouse effect", "natural selection", "electric circuits", "the speed of light", "entropy",
           "the immune system", "nuclear fusion", "ocean tides", "the nitrogen cycle", "magnetism", "sound waves",
           "the periodic table", "enzymes", "cloud formation", "volcanoes", "earthquakes", "antibiotic resistance",
           "the human heart", "semiconductors", "GPS satellites", "rainbows", "friction", "buoyancy", "osmosis",
           "the Doppler effect", "radioactive decay", "the carbon cycle", "neurons", "solar panels", "lasers"]
HUMANITIES = ["the Renaissance", "the printing press", "the Silk Road", "the Industrial Revolution",
              "ancient Greek democracy", "the Roman aqueducts", "the Meiji Restoration", "the invention of writing",
              "Impressionist painting", "the history of jazz", "the Enlightenment", "the fall of the Berlin Wall",
              "the Magna Carta", "Stoic philosophy", "the spread of coffeehouses in Europe", "the Olympic Games",
              "the history of the bicycle", "utilitarianism", "the Harlem Renaissance", "the Bauhaus movement",
              "medieval trade guilds", "the Mali Empire", "the invention of paper", "existentialism",
              "the Hanseatic League", "the history of public libraries", "the Age of Exploration"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "counts the vowels in a sentence",
              "merges two sorted lists", "finds the largest element of a list", "removes duplicates from a list",
              "converts Celsius to Fahrenheit", "checks whether a word is a palindrome",
              "computes the factorial of n iteratively", "returns the second smallest number in a list",
              "flattens a nested list", "counts word frequencies in a text", "validates an email address",
              "computes the greatest common divisor of two integers", "transposes a matrix",
              "implements binary search", "parses a CSV line into fields", "rotates a list by k positions",
              "groups words that are anagrams", "computes a running average", "checks balanced parentheses",
              "converts a Roman numeral to an integer", "finds the longest common prefix of a list of strings",
              "generates the first n rows of Pascal's triangle", "sums the digits of a number",
              "implements a simple stack class", "reads a text file and prints its longest line",
              "computes the median of a list", "capitalizes the first letter of each word",
              "returns all even numbers from a list"]
LANGS = ["Python", "JavaScript", "Java", "C", "Rust", "Go", "Ruby", "TypeScript"]
CODE_CONCEPTS = ["recursion", "a hash map", "a linked list", "Big-O notation", "a race condition", "garbage collection",
                 "unit testing", "version control with git", "an API", "a closure", "dynamic programming",
                 "object-oriented programming", "a database index", "caching", "a REST endpoint", "regular expressions",
                 "exceptions", "a queue", "binary trees", "immutability"]
ROLES = ["a medieval blacksmith", "a pirate captain", "a tour guide in ancient Rome", "a friendly librarian",
         "a sports coach before a big game", "a detective in 1920s London", "a chef running a busy kitchen",
         "a wise old wizard", "a park ranger", "a spaceship captain", "a museum curator", "a barista",
         "a kindergarten teacher", "a news anchor", "a lighthouse keeper", "a knight returning from a quest",
         "a time traveler from the year 3000", "a fitness trainer", "a mountain guide", "a robot butler"]
ROLE_QS = ["What does a typical day look like for you?", "What advice would you give to someone starting out?",
           "Tell me about the hardest moment of your career.", "What do you love most about your work?",
           "How would you greet a new visitor?", "Describe the place where you work.",
           "What is one mistake beginners always make?", "What are you most proud of?"]
NAMES = ["Alice", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Leo",
         "Maya", "Nina", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yuki", "Zoe"]
ITEMS = ["apples", "notebooks", "pencils", "marbles", "stickers", "cookies", "tickets", "books", "oranges", "stamps"]
SENTENCES = ["The library opens at nine o'clock every morning.", "My brother is learning to play the guitar.",
             "It rained all weekend, so we stayed inside and read.", "Could you tell me where the train station is?",
             "The children planted tomatoes in the school garden.", "We are going to visit our grandparents in July.",
             "This soup needs a little more salt.", "She finished the marathon in under four hours.",
             "The museum is closed on Mondays.", "I forgot my umbrella at the office.",
             "The new bridge will connect the two villages.", "Please turn off the lights when you leave.",
             "Our team won the match in the last minute.", "The cat is sleeping on the windowsill.",
             "He writes a letter to his friend every month.", "The market sells fresh bread and cheese."]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
PARA_SUBJECTS = [
    ("a town that replaced its streetlights with LEDs", "energy use fell by a third, residents reported brighter streets, "
     "and the savings paid for the project within four years, although some astronomers complained about glare"),
    ("a school that moved its start time one hour later", "attendance rose, students reported more sleep, and test scores "
     "improved slightly, while parents had to adjust their work schedules and buses were rerouted"),
    ("a bakery that switched to a four-day week", "staff turnover dropped, the owner extended opening hours on the remaining "
     "days, and sales stayed level, although some regular customers were confused by the new schedule"),
    ("a city that opened a network of protected bike lanes", "cycling trips doubled in two years, traffic injuries fell, "
     "and local shops on the new routes reported more visitors, despite early protests over lost parking"),
    ("a library that started lending tools", "residents borrowed drills, ladders and garden equipment, the program grew to "
     "over five hundred items, and volunteers began running repair workshops on weekends"),
    ("a farm that introduced drip irrigation", "water use fell by forty percent, yields of tomatoes and peppers increased, "
     "and the farmer now trains neighbours, though the initial equipment cost was high"),
    ("a museum that offered free evening entry", "visitor numbers rose sharply among young adults, the cafe stayed open "
     "later, and the museum recruited new members, but staffing costs increased"),
    ("a company that banned meetings on Wednesdays", "employees reported longer stretches of focused work, project deadlines "
     "were met more often, and managers moved status updates to short written reports"),
    ("a village that built a community solar park", "households cut their electricity bills, the profits funded a new "
     "playground, and the project inspired two neighbouring villages to start similar plans"),
    ("a hospital that introduced therapy dogs", "patients said they felt less anxious, nurses noticed calmer waiting rooms, "
     "and the program expanded from one ward to five within a year"),
]
FOODS = ["a vegetable curry", "banana bread", "a lentil soup", "homemade pizza dough", "a summer salad",
         "pancakes", "a mushroom risotto", "guacamole", "a simple tomato sauce", "oatmeal cookies"]
PRODUCTS = ["a reusable water bottle", "a standing desk", "noise-cancelling headphones", "an e-reader", "a smartwatch",
            "a robot vacuum", "a hiking backpack", "a language-learning app", "a coffee grinder", "an electric scooter"]
EVENTS = ["a charity bake sale", "a neighborhood cleanup day", "a coding workshop for teenagers", "a book club meeting",
          "a community film night", "a science fair", "a farmers' market opening", "a photography walk",
          "a chess club tournament", "a beach volunteering day"]
PAIRS = [("cats", "dogs"), ("tea", "coffee"), ("trains", "planes"), ("e-books", "printed books"),
         ("renting", "buying a home"), ("city life", "country life"), ("solar power", "wind power"),
         ("working from home", "working in an office"), ("Python", "JavaScript"), ("running", "swimming"),
         ("public schools", "private schools"), ("paper notes", "digital notes"), ("summer", "winter"),
         ("SQL databases", "NoSQL databases"), ("museums", "zoos")]
SKILLS = ["public speaking", "time management", "learning to cook", "starting to run", "saving money",
          "learning to draw", "writing a resume", "studying for exams", "making new friends in a new city",
          "keeping a plant alive", "negotiating a salary", "learning to swim as an adult", "reducing screen time",
          "organizing a small home", "preparing for a job interview", "giving constructive feedback"]
QA_FACTS = ["What is the capital of Australia?", "How many bones are in the adult human body?",
            "Who wrote the novel Pride and Prejudice?", "What is the boiling point of water at sea level in Celsius?",
            "Which planet is known as the Red Planet?", "What is the largest ocean on Earth?",
            "Who painted the Mona Lisa?", "How many continents are there?", "What gas do plants absorb from the air?",
            "What is the longest river in Africa?", "In which country are the pyramids of Giza?",
            "What is the chemical symbol for gold?", "Who developed the theory of general relativity?",
            "What language is spoken in Brazil?", "How many minutes are in a day?",
            "What is the tallest mountain in the world?", "Which instrument has 88 keys?",
            "What is the smallest prime number?", "What is the main ingredient of hummus?",
            "Which animal is the largest mammal?", "What year did the first person walk on the Moon?",
            "What does a thermometer measure?", "What is the freezing point of water in Fahrenheit?",
            "How many sides does a hexagon have?", "Which organ pumps blood through the body?"]


def writing(rng):
    t = rng.choice([
        "Write a short story about {c} and {o}.",
        "Write a travel diary entry about a week spent in {p}.",
        "Write a blog post about what you learned from {t}.",
        "Write a persuasive essay arguing for more investment in {t}.",
        "Write a friendly email inviting your colleagues to {e}.",
        "Write a formal letter to a city council asking for support for {e}.",
        "Write a poem about {o}.",
        "Describe {p} in a vivid paragraph full of sensory details.",
        "Write the opening paragraph of a mystery novel that involves {o}.",
        "Write a product description for {pr}.",
        "Write a short speech for the opening of {e}.",
        "Write a diary entry from the point of view of {c}.",
        "Write a newsletter announcement for {e}.",
        "Write a thank-you note to a teacher who inspired you to study {h}.",
        "Write a short dialogue between {c} and {c2}.",
        "Write a review of {pr} for a consumer magazine.",
        "Write a cover letter for a job at a company that works on {t}.",
        "Write an outline for a blog post about {t}, with headings and key points.",
        "Write a fairy tale in which {c} discovers {o}.",
        "Write a motivational message for someone who is {s}.",
        "Write a social media post promoting {e}.",
        "Write a short op-ed about the future of {t}.",
        "Write a haiku sequence about {p}.",
        "Write a character sketch of {c}.",
        "Write a limerick about {c}.",
        "Write a short story set in {p} about {c}.",
        "Write a blog post about {t} aimed at {a}.",
        "Write an email to {a} explaining why {t} matters.",
        "Write a scene in which {c} finds {o} in {p}.",
        "Write a magazine article about {t} with a catchy title and three sections.",
        "Write a short letter from {c} to {c2}.",
    ])
    return t.format(c=rng.choice(CHARACTERS), c2=rng.choice(CHARACTERS), o=rng.choice(OBJECTS), p=rng.choice(PLACES),
                    t=rng.choice(TOPICS), e=rng.choice(EVENTS), pr=rng.choice(PRODUCTS), h=rng.choice(HUMANITIES),
                    s=rng.choice(SKILLS), a=rng.choice(AUDIENCES))


def roleplay(rng):
    t = rng.choice([
        "Act as {r}. {q}",
        "You are {r}. Stay in character and answer: {q}",
        "Pretend to be {r} talking to a group of visitors. {q}",
        "Imagine you are {r}. Explain {t} in your own style.",
        "Play the role of {r} and give me advice on {s}.",
    ])
    return t.format(r=rng.choice(ROLES), q=rng.choice(ROLE_QS), t=rng.choice(TOPICS), s=rng.choice(SKILLS))


def reasoning(rng):
    a, b = rng.sample(NAMES, 2)
    n1, n2, n3 = rng.randint(3, 40), rng.randint(2, 15), rng.randint(2, 9)
    it = rng.choice(ITEMS)
    t = rng.choice([
        f"{a} is taller than {b}, and {b} is taller than {rng.choice(NAMES)}. Who is the shortest? Explain your reasoning.",
        f"If all bloops are razzies and some razzies are lazzies, can we conclude that some bloops are lazzies? Explain.",
        f"{a} has {n1} {it}. {b} has {n2} more than {a}. How many {it} do they have together? Show your reasoning.",
        f"A train leaves at {rng.randint(1, 11)}:{rng.choice(['00', '15', '30', '45'])} and the trip takes {n3} hours "
        f"and {rng.choice([10, 20, 25, 40])} minutes. When does it arrive? Think step by step.",
        f"There are {n3} boxes, each with {n2} {it}. {a} takes {rng.randint(1, n2)} {it} from each box. How many are left?",
        f"In a race, {a} finished before {b} but after {rng.choice(NAMES)}. Who came first among the three?",
        f"Today is {rng.choice(['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday'])}. "
        f"What day of the week will it be in {n1} days? Explain.",
        f"A farmer has chickens and cows. There are {n1 + n2} heads in total. If there are {n2} cows, how many legs are there?",
        f"{a} is twice as old as {b}. In {n3} years, the sum of their ages will be {3 * n1 + 2 * n3}. How old is {b} now?",
        f"What comes next in the sequence {n3}, {2 * n3}, {4 * n3}, {8 * n3}, ...? Explain the pattern.",
    ])
    return t


def math_q(rng):
    x, y, z = rng.randint(2, 90), rng.randint(2, 60), rng.randint(2, 12)
    t = rng.choice([
        f"Solve for x: {z}x + {y} = {z * x + y}.",
        f"What is {x}% of {y * 10}?",
        f"A rectangle has a length of {x} cm and a width of {y} cm. What are its area and perimeter?",
        f"Find the sum of all integers from 1 to {x}.",
        f"A shirt costs ${x}. It is on sale for {rng.choice([10, 15, 20, 25, 30])}% off. What is the sale price?",
        f"What is the least common multiple of {z} and {y}?",
        f"A car travels {x * 3} km in {z} hours. What is its average speed?",
        f"Simplify the fraction {x * z}/{y * z}.",
        f"A circle has a radius of {z} meters. What are its circumference and area?",
        f"If a recipe needs {z} eggs for {y} cookies, how many eggs are needed for {y * 3} cookies?",
        f"Compute the derivative of f(x) = {z}x^3 - {y}x + {x}.",
        f"The average of {z} numbers is {x}. If one more number, {y}, is added, what is the new average?",
        f"What is the probability of rolling a sum of {rng.randint(2, 12)} with two fair dice?",
        f"Solve the system: x + y = {x + y}, x - y = {x - y}.",
        f"How many seconds are there in {z} hours and {y} minutes?",
    ])
    return t


def coding(rng):
    lang, task = rng.choice(LANGS), rng.choice(CODE_TASKS)
    t = rng.choice([
        f"Write a {lang} function that {task}.",
        f"Write a {lang} function that {task}, and include a few example calls.",
        f"Explain how to write a program in {lang} that {task}, then show the code.",
        f"Explain {rng.choice(CODE_CONCEPTS)} to a beginner programmer, with a short {lang} example.",
        f"What is the difference between {rng.choice(CODE_CONCEPTS)} and {rng.choice(CODE_CONCEPTS)}?",
        f"Write unit tests in {lang} for a function that {task}.",
        f"Here is a task: a program that {task}. Describe an algorithm for it and give its time complexity.",
    ])
    return t


def extraction(rng):
    a, b, c = rng.sample(NAMES, 3)
    p1, p2 = rng.sample(PLACES, 2)
    t = rng.choice([
        f"Extract all the names of people from this text: \"{a} met {b} in {p1} last spring, and later they both "
        f"visited {c} in {p2}.\"",
        f"List the places mentioned in the following sentence: \"After leaving {p1}, the group travelled to {p2} "
        f"before returning home.\"",
        f"From this note, extract the date, the time and the location as JSON: \"Meeting with {a} on "
        f"{rng.choice(['March', 'May', 'June', 'October'])} {rng.randint(1, 28)} at {rng.randint(8, 17)}:00 in room "
        f"{rng.randint(100, 450)}.\"",
        f"Classify the sentiment of this review as positive, negative or neutral: \"I bought {rng.choice(PRODUCTS)} "
        f"and it {rng.choice(['works perfectly', 'broke after a week', 'is fine but nothing special'])}.\"",
        f"Turn the following information into a table with columns name and city: {a} lives in {p1}, {b} lives in "
        f"{p2}, {c} lives in {rng.choice(PLACES)}.",
        f"Identify the main topic and three keywords of this sentence: \"{rng.choice(SENTENCES)}\"",
    ])
    return t


def stem(rng):
    s, s2 = rng.sample(SCIENCE, 2)
    t = rng.choice([
        f"Explain {s} in simple terms.",
        f"How does {s} work? Give an everyday example.",
        f"Explain {s} to {rng.choice(AUDIENCES)}.",
        f"What are the most common misconceptions about {s}?",
        f"Describe an experiment a student could do at home to learn about {s}.",
        f"What is the connection between {s} and {s2}?",
        f"Why is {s} important for modern technology or medicine?",
        f"Write a short quiz with answers about {s}.",
    ])
    return t


def humanities(rng):
    h, h2 = rng.sample(HUMANITIES, 2)
    t = rng.choice([
        f"Give a brief overview of {h}.",
        f"Why was {h} important, and what is its legacy today?",
        f"Compare {h} and {h2}.",
        f"Explain {h} to {rng.choice(AUDIENCES)}.",
        f"What were the main causes and effects of {h}?",
        f"Write three discussion questions for a class about {h}.",
        f"How did {h} change everyday life for ordinary people?",
    ])
    return t


def explain(rng):
    tp = rng.choice(TOPICS)
    t = rng.choice([
        f"What are the pros and cons of {tp}?",
        f"How can someone get started with {rng.choice(SKILLS)}? Give practical steps.",
        f"Give me five tips for {rng.choice(SKILLS)}.",
        f"Compare {'{}'} and {'{}'}: which would you recommend and why?".format(*rng.choice(PAIRS)),
        f"What should a beginner know about {tp}?",
        f"List ten ideas related to {tp} for a school project.",
        f"Give me a step-by-step recipe for {rng.choice(FOODS)}.",
        f"How do I plan {rng.choice(EVENTS)}? Make a checklist.",
        f"Create a one-week plan for {rng.choice(SKILLS)}.",
        f"What are common mistakes people make with {tp}, and how can they avoid them?",
        f"Explain the impact of {tp} on society.",
        f"Suggest a weekend itinerary for {rng.choice(PLACES)}.",
    ])
    return t


def summary(rng):
    subj, body = rng.choice(PARA_SUBJECTS)
    t = rng.choice([
        f"Summarize the following in one sentence: A report described {subj}. After the change, {body}.",
        f"Summarize this paragraph for a newsletter: Local reporters followed {subj}. They found that {body}.",
        f"Give three bullet points summarizing this: In a recent case study of {subj}, {body}.",
        f"Read this and write a headline plus a two-sentence summary: This year saw {subj}; {body}.",
    ])
    return t


def translate(rng):
    s, lang = rng.choice(SENTENCES), rng.choice(LANGUAGES)
    t = rng.choice([
        f"Translate into {lang}: {s}",
        f"How would you say \"{s}\" in {lang}?",
        f"Translate the following English sentence into {lang} and explain any tricky words: {s}",
        f"Rewrite this sentence in a more formal tone: {s}",
        f"Correct any grammar mistakes and improve the style: {s.lower().rstrip('.')} and it was good",
    ])
    return t


def qa(rng):
    q = rng.choice(QA_FACTS)
    t = rng.choice(["{q}", "{q} Answer briefly.", "{q} Explain your answer.", "Quick question: {q}",
                    "{q} Also give one interesting fact about it."])
    return t.format(q=q)


CATS = {"writing": (writing, 6), "roleplay": (roleplay, 2), "reasoning": (reasoning, 1), "math": (math_q, 1),
        "coding": (coding, 2), "extraction": (extraction, 1), "stem": (stem, 2), "humanities": (humanities, 2),
        "explain": (explain, 3), "summary": (summary, 1), "translation": (translate, 1), "qa": (qa, 1)}


def norm(s):
    return re.sub(r"\s+", " ", s).strip().lower()


def eval_turns(pattern):
    out = []
    for path in sorted(glob.glob(pattern)):
        for line in open(path):
            if line.strip():
                d = json.loads(line)
                if "prompt" in d:
                    out.append(d["prompt"])
                out += list(d.get("turns", []) or [])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/eagle3-smollm2/prompts.jsonl")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-prompt-files", default="configs/prompts/*.jsonl")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cats = list(CATS)
    weights = [CATS[c][1] for c in cats]
    seen, rows = set(), []
    tries = 0
    while len(rows) < args.n and tries < args.n * 50:
        tries += 1
        c = rng.choices(cats, weights)[0]
        p = CATS[c][0](rng)
        if norm(p) in seen:
            continue
        seen.add(norm(p))
        rows.append({"category": c, "prompt": p})
    rng.shuffle(rows)
    ev = [norm(t) for t in eval_turns(args.eval_prompt_files)]
    hits = 0
    for r in rows:
        p = norm(r["prompt"])
        for e in ev:
            if p == e or p in e or (len(e) >= 16 and e in p):
                hits += 1
                print("overlap:", r["prompt"][:80], "|", e[:80])
    assert hits == 0, f"{hits} prompts overlap an evaluation turn"
    with open(args.out, "w") as fh:
        for i, r in enumerate(rows):
            fh.write(json.dumps({"id": f"train-{i}", "category": r["category"], "prompt": r["prompt"]}) + "\n")
    print(f"{len(rows)} prompts ({tries} draws) -> {args.out}; categories "
          f"{dict(collections.Counter(r['category'] for r in rows))}; checked against {len(ev)} evaluation turns of "
          f"{args.eval_prompt_files}: no prompt equals, is contained in or contains one")


if __name__ == "__main__":
    main()
