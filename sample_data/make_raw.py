"""Write ``sample_data/raw.jsonl``: ~400 synthetic token-weighted records for tests, docs and benchmarks.

Deterministic (one seeded ``random.Random``, stdlib only, no network): running it twice gives a
byte-identical file. Each line is ``{"pieces": [{"text": ..., "weight": ...}, ...], "source": ..., "id": ...}``;
a piece's text carries its own whitespace and the document is the plain concatenation of the texts.

The mix (see sample_data/README.md for the counts this seed produces):

- ``instruction``: "### Instruction: ... ### Response:" prompt (weight 0) + answer (weight 1);
- ``weighted``: an answer cut into spans weighted 0.5 / 1.0 / 2.0 (hedges, body, key phrases);
- ``chat``: multi-turn chats, ``<|system|>``/``<|user|>`` turns and role markers weight 0, assistant turns 1;
- ``prose``: a single weight-1 piece of one to several paragraphs;
- ``multilingual``: accented European languages, Chinese, Japanese, Arabic, Hebrew and emoji,
  as instructions, chats and prose;
- ``tiny``: a handful of records of a few tokens;
- ``overlong``: a few long multi-section documents (20-40k characters, well over 2048 tokens).

Usage: ``python sample_data/make_raw.py [--out sample_data/raw.jsonl] [--seed 20240611]``
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20240611
HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------------------------
# Word banks and sentence templates, by topic.
# ---------------------------------------------------------------------------------------------

DISHES = [
    ("tomato soup", ["tomatoes", "onion", "garlic", "vegetable stock", "olive oil", "basil"]),
    ("mushroom risotto", ["arborio rice", "mushrooms", "shallots", "white wine", "parmesan", "butter"]),
    ("banana bread", ["ripe bananas", "flour", "brown sugar", "eggs", "baking soda", "butter"]),
    ("chicken curry", ["chicken thighs", "onion", "ginger", "garlic", "curry powder", "coconut milk"]),
    ("lentil stew", ["red lentils", "carrots", "celery", "cumin", "tomato paste", "lemon"]),
    ("pancakes", ["flour", "milk", "eggs", "baking powder", "sugar", "salt"]),
    ("guacamole", ["avocados", "lime", "red onion", "cilantro", "jalapeño", "salt"]),
    ("shakshuka", ["eggs", "tomatoes", "red pepper", "paprika", "cumin", "feta"]),
    ("focaccia", ["bread flour", "yeast", "olive oil", "flaky salt", "rosemary", "water"]),
    ("pad thai", ["rice noodles", "tamarind paste", "fish sauce", "eggs", "peanuts", "bean sprouts"]),
    ("roast vegetables", ["carrots", "parsnips", "red onion", "olive oil", "thyme", "garlic"]),
    ("apple crumble", ["apples", "oats", "flour", "butter", "cinnamon", "brown sugar"]),
]
COOK_TIPS = [
    "Taste as you go and adjust the salt at the end, not the beginning.",
    "Let the pan get properly hot before the first ingredient goes in.",
    "Rest the dough for at least thirty minutes so the gluten can relax.",
    "A squeeze of lemon just before serving brightens almost any stew.",
    "Toast whole spices in a dry pan until fragrant, then grind them.",
    "Do not crowd the pan, or the vegetables will steam instead of brown.",
    "Keep the stock at a gentle simmer on the back burner while you work.",
    "Overripe bananas with black spots give the deepest flavor.",
    "Pat the meat dry with paper towels so it sears rather than boils.",
    "If the sauce splits, whisk in a spoonful of cold water off the heat.",
    "Weigh your flour instead of using cups; it is far more consistent.",
    "Leftovers keep for three days in an airtight container in the fridge.",
]
COOK_STEPS = [
    "Whisk the {a} and the {b} together in a bowl until smooth.",
    "Heat the {fat} in a large pot over medium heat.",
    "Add the {a} and cook for {n} minutes, stirring now and then.",
    "Stir in the {b} and let everything cook until soft and fragrant.",
    "Pour in the {c} and bring it to a gentle boil.",
    "Reduce the heat and simmer for {m} minutes.",
    "Season with salt and pepper, then fold in the {d}.",
    "Transfer to a baking dish and bake at {t}°C for {m} minutes.",
    "Finish with the {d} and serve immediately.",
]

HISTORY = [
    (
        "the printing press",
        "Johannes Gutenberg",
        "around 1440",
        "Mainz",
        "it made books cheaper and spread literacy across Europe",
    ),
    (
        "the Silk Road",
        "merchants of many nations",
        "from the second century BCE",
        "Chang'an",
        "it carried silk, spices, ideas and diseases between China and the Mediterranean",
    ),
    (
        "the Magna Carta",
        "English barons",
        "in 1215",
        "Runnymede",
        "it established that the king was subject to the law",
    ),
    (
        "the steam engine",
        "James Watt",
        "in the 1760s and 1770s",
        "Glasgow",
        "it powered the factories and railways of the Industrial Revolution",
    ),
    (
        "the fall of the Berlin Wall",
        "East German citizens",
        "on 9 November 1989",
        "Berlin",
        "it opened the way to German reunification in 1990",
    ),
    (
        "the Library of Alexandria",
        "the Ptolemaic kings",
        "in the third century BCE",
        "Alexandria",
        "it gathered scholars and manuscripts from across the ancient world",
    ),
    (
        "the voyages of Zheng He",
        "the Ming admiral Zheng He",
        "between 1405 and 1433",
        "Nanjing",
        "they showed the reach of Chinese naval power across the Indian Ocean",
    ),
    (
        "the Meiji Restoration",
        "reformers around Emperor Meiji",
        "in 1868",
        "Tokyo",
        "it turned Japan into an industrial state within a few decades",
    ),
    (
        "the Rosetta Stone",
        "French soldiers",
        "in 1799",
        "Rashid",
        "it allowed Champollion to decipher Egyptian hieroglyphs in 1822",
    ),
    ("the Apollo 11 landing", "NASA", "in July 1969", "Houston", "it put the first humans on the Moon"),
]
HISTORY_SENTENCES = [
    "Historians still debate how much {who} understood the consequences at the time.",
    "The event is usually dated {when}, although the preparations took years.",
    "Contemporary accounts from {where} describe both excitement and fear.",
    "Its importance lies in the fact that {why}.",
    "Before {what}, information and goods moved far more slowly.",
    "Many of the records we rely on were written decades later, which makes them hard to verify.",
    "Modern scholarship emphasizes the role of ordinary people, not only of {who}.",
    "Museums in {where} still display objects connected to {what}.",
    "Some of the popular stories about {what} are legends added much later.",
    "Economic pressure, not only ideas, explains why it happened {when}.",
]

TRAVEL = [
    ("Lisbon", "Portugal", "the Alfama district", "pastéis de nata", "tram 28"),
    ("Kyoto", "Japan", "the Fushimi Inari shrine", "matcha sweets", "the city buses"),
    ("Mexico City", "Mexico", "the Coyoacán neighborhood", "tacos al pastor", "the metro"),
    ("Reykjavík", "Iceland", "the Hallgrímskirkja church", "lamb soup", "a rental car"),
    ("Marrakesh", "Morocco", "the Jemaa el-Fnaa square", "tagine", "petit taxis"),
    ("Hanoi", "Vietnam", "the Old Quarter", "phở", "a motorbike taxi"),
    ("Edinburgh", "Scotland", "the Royal Mile", "cullen skink", "your own two feet"),
    ("Buenos Aires", "Argentina", "San Telmo", "empanadas", "the Subte"),
    ("Istanbul", "Türkiye", "the Grand Bazaar", "simit", "the ferries across the Bosphorus"),
    ("Cape Town", "South Africa", "the V&A Waterfront", "bobotie", "the MyCiTi buses"),
]
TRAVEL_SENTENCES = [
    "Spend your first morning in {spot}, before the tour groups arrive.",
    "Getting around is easiest with {transport}, which is cheap and frequent.",
    "Do not leave without trying {food}; locals will happily argue about where to find the best.",
    "Spring and autumn are the most comfortable seasons to visit {city}.",
    "Carry some cash, because smaller shops and markets often do not take cards.",
    "Book popular museums a few days ahead, especially on weekends.",
    "Learn a few words of the local language; a simple greeting goes a long way.",
    "Three days is enough for the highlights of {city}, but a week lets you slow down.",
    "Travel insurance is worth it, even for a short trip to {country}.",
    "Pack comfortable shoes: the best parts of {city} are explored on foot.",
]

SUPPORT_ISSUES = [
    (
        "my order hasn't arrived",
        "Orders usually arrive within five business days. I can see that yours left our "
        "warehouse on Monday and is with the courier now.",
    ),
    (
        "I was charged twice",
        "I'm sorry about that. I can see two authorizations on the card; the second one is a "
        "temporary hold and will be released automatically within three to five days.",
    ),
    (
        "I can't log in to my account",
        "Let's reset your password. I've just sent a reset link to the email on file; "
        "it is valid for thirty minutes.",
    ),
    (
        "the item arrived damaged",
        "I'm sorry it arrived like that. Could you send a photo of the damage? As soon as I "
        "have it, I will ship a replacement at no cost.",
    ),
    (
        "I want to cancel my subscription",
        "I can help with that. Your subscription will stay active until the end of "
        "the current billing period, and you won't be charged again.",
    ),
    (
        "the app crashes when I open it",
        "Thanks for reporting this. Please update to the latest version from the app "
        "store; version 4.2.1 fixed a crash on startup for some devices.",
    ),
    (
        "I need an invoice for my purchase",
        "Of course. You can download the invoice from Orders > Details > Invoice, "
        "and I've also emailed a copy to you just now.",
    ),
    (
        "my discount code doesn't work",
        "That code expired on the 31st, but I've applied the same discount to your "
        "cart manually, so you'll see it at checkout.",
    ),
]
CUSTOMER_NAMES = [
    "Ana",
    "Ben",
    "Chloé",
    "Dmitri",
    "Emeka",
    "Fatima",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Keiko",
    "Liam",
    "Mei",
    "Noah",
    "Olga",
    "Priya",
    "Rafael",
    "Sara",
    "Tomás",
    "Yusuf",
]
AGENT_NAMES = ["Alex", "Jordan", "Sam", "Taylor", "Morgan", "Riley"]

# Cooking steps are listed in the order a recipe uses them; a recipe takes a sorted subset ending in the last.
# Programming: (task, language, code) with {name} placeholders for identifiers.
CODE_TASKS = [
    (
        "reverse the words in a sentence",
        "python",
        'def {fn}(sentence: str) -> str:\n    """Return the words of sentence in reverse order."""\n'
        '    return " ".join(reversed(sentence.split()))\n\n\nprint({fn}("the quick brown fox"))\n',
    ),
    (
        "count how often each word appears in a text file",
        "python",
        'from collections import Counter\n\n\ndef {fn}(path):\n    with open(path, encoding="utf-8") as f:\n'
        "        {var} = Counter(word.lower() for line in f for word in line.split())\n"
        "    return {var}.most_common(10)\n",
    ),
    (
        "compute Fibonacci numbers without recursion",
        "python",
        "def {fn}(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
        "assert [{fn}(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]\n",
    ),
    (
        "read a CSV file and sum one column",
        "python",
        'import csv\n\n\ndef {fn}(path, column):\n    {var} = 0.0\n    with open(path, newline="") as f:\n'
        "        for row in csv.DictReader(f):\n            {var} += float(row[column])\n    return {var}\n",
    ),
    (
        "debounce a function in JavaScript",
        "javascript",
        "function {fn}(callback, delayMs) {{\n  let timer = null;\n  return (...args) => {{\n"
        "    clearTimeout(timer);\n    timer = setTimeout(() => callback(...args), delayMs);\n  }};\n}}\n",
    ),
    (
        "find the five customers with the most orders",
        "sql",
        "SELECT c.name, COUNT(o.id) AS {var}\nFROM customers AS c\nJOIN orders AS o ON o.customer_id = c.id\n"
        "GROUP BY c.name\nORDER BY {var} DESC\nLIMIT 5;\n",
    ),
    (
        "back up a directory with a timestamp",
        "bash",
        '#!/usr/bin/env bash\nset -euo pipefail\n{var}="backup-$(date +%Y%m%d-%H%M%S).tar.gz"\n'
        'tar -czf "${var}" "$1"\necho "wrote ${var}"\n',
    ),
    (
        "check whether a string is a palindrome",
        "python",
        "def {fn}(text: str) -> bool:\n    {var} = [c.lower() for c in text if c.isalnum()]\n"
        "    return {var} == {var}[::-1]\n",
    ),
    (
        "merge two sorted lists",
        "python",
        "def {fn}(left, right):\n    {var} = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
        "        if left[i] <= right[j]:\n            {var}.append(left[i]); i += 1\n        else:\n"
        "            {var}.append(right[j]); j += 1\n    return {var} + left[i:] + right[j:]\n",
    ),
    (
        "fetch JSON from an API with retries",
        "python",
        "import time\nimport urllib.request\nimport json\n\n\ndef {fn}(url, attempts=3):\n"
        "    for attempt in range(attempts):\n        try:\n            with urllib.request.urlopen(url, timeout=10) as r:\n"
        "                return json.load(r)\n        except OSError:\n            time.sleep(2 ** attempt)\n"
        '    raise RuntimeError(f"gave up on {{url}}")\n',
    ),
    (
        "define a Rust struct with a method",
        "rust",
        "struct Rectangle {{\n    width: f64,\n    height: f64,\n}}\n\nimpl Rectangle {{\n"
        "    fn area(&self) -> f64 {{\n        self.width * self.height\n    }}\n}}\n",
    ),
]
LANGUAGE_NAMES = {
    "python": "Python",
    "javascript": "JavaScript",
    "sql": "SQL",
    "bash": "Bash",
    "rust": "Rust",
}
FN_NAMES = ["solve", "process", "compute", "run", "helper", "main_task", "transform", "build"]
VAR_NAMES = ["total", "result", "counts", "out", "acc", "items", "archive"]
CODE_EXPLANATIONS = [
    "The function runs in linear time in the size of its input.",
    "It uses only the standard library, so there is nothing to install.",
    "Edge cases such as an empty input are handled naturally by the loop.",
    "You could add type hints and a docstring if this goes into a shared codebase.",
    "For very large inputs, consider streaming the data instead of loading it all at once.",
    "Write a small unit test for it before you refactor anything.",
    "The names are only suggestions; rename them to fit your project's conventions.",
]

PROSE_OPENERS = [
    "There is a particular pleasure in doing small things well.",
    "Most advice about productivity ignores how tired people actually are.",
    "The old harbor was quiet in the early morning, except for the gulls.",
    "Every city has a street that locals love and visitors never find.",
    "Learning a new language in adulthood is humbling in the best way.",
    "The history of maps is also a history of what people chose to leave out.",
    "Good documentation is a letter to a stranger who is having a bad day.",
    "Bread has been made in roughly the same way for thousands of years.",
]
PROSE_SENTENCES = [
    "It rewards patience more than talent, and attention more than speed.",
    "Nobody notices when it goes right, which is exactly the point.",
    "The first attempts are rarely good, but they are necessary.",
    "A few hours of quiet work can undo weeks of scattered effort.",
    "She wrote everything down, because memory is a generous liar.",
    "By noon the market was crowded and the light had turned hard and white.",
    "Over the years the habit became a kind of ritual.",
    "What matters is less the method than the willingness to keep going.",
    "He kept the letters in a shoebox under the bed for forty years.",
    "The results were modest, but they were honest and repeatable.",
    "In the end, the simplest explanation turned out to be the right one.",
    "Rain came in from the west, and the streets emptied in minutes.",
    "Every rule had an exception, and every exception had a story.",
    "The committee met twice, argued for hours, and changed nothing.",
    "Small improvements, repeated daily, compound into large ones.",
    "The view from the ridge made the long climb feel short in memory.",
]

HEDGES = [
    "This is only a rule of thumb.",
    "Your mileage may vary.",
    "Of course, there are exceptions.",
    "That said, it depends on the details.",
    "Some people prefer a different approach.",
]

# Non-ASCII banks: per language, (question, answer sentences) pairs written as real text.
MULTI = {
    "fr": [
        (
            "Comment préparer une bonne pâte à crêpes ?",
            [
                "Mélangez la farine, les œufs et le lait jusqu'à obtenir une pâte lisse.",
                "Ajoutez une pincée de sel et un peu de beurre fondu.",
                "Laissez reposer la pâte une heure au réfrigérateur avant la cuisson.",
            ],
        ),
        (
            "Quels sont les monuments à voir à Paris ?",
            [
                "La tour Eiffel, le Louvre et Notre-Dame sont incontournables.",
                "Prévoyez aussi une promenade à Montmartre, près du Sacré-Cœur.",
                "Le musée d'Orsay est idéal un jour de pluie.",
            ],
        ),
        (
            "Peux-tu m'expliquer la Révolution française en quelques phrases ?",
            [
                "La Révolution a commencé en 1789 avec la prise de la Bastille.",
                "Elle a mis fin à la monarchie absolue et proclamé les droits de l'homme.",
                "Ses idées ont influencé toute l'Europe au siècle suivant.",
            ],
        ),
        (
            "Écris un court message pour remercier un collègue.",
            [
                "Merci beaucoup pour ton aide précieuse cette semaine, c'était très apprécié.",
                "N'hésite pas à me solliciter si je peux t'être utile à mon tour.",
                "Bonne fin de journée et à très bientôt !",
            ],
        ),
    ],
    "de": [
        (
            "Wie backe ich ein einfaches Brot?",
            [
                "Für ein einfaches Brot brauchst du Mehl, Wasser, Hefe und Salz.",
                "Der Teig muss mindestens eine Stunde an einem warmen Ort gehen.",
                "Backe das Brot bei 230 °C, bis es beim Klopfen hohl klingt.",
            ],
        ),
        (
            "Was sollte ich in München unbedingt sehen?",
            [
                "Der Marienplatz und der Englische Garten sind wunderschön.",
                "Im Viktualienmarkt kannst du gut zu Mittag essen.",
                "Für einen Tagesausflug lohnt sich das Schloss Neuschwanstein.",
            ],
        ),
        (
            "Erkläre mir bitte kurz, wie ein Kühlschrank funktioniert.",
            [
                "Ein Kühlschrank entzieht dem Innenraum Wärme und gibt sie nach außen ab.",
                "Dafür verdampft ein Kältemittel und wird anschließend wieder verdichtet.",
                "Deshalb ist die Rückseite des Geräts spürbar warm.",
            ],
        ),
    ],
    "es": [
        (
            "¿Cómo se prepara una tortilla de patatas?",
            [
                "Pela y corta las patatas en láminas finas, y fríelas a fuego lento.",
                "Bate los huevos y mézclalos con las patatas todavía calientes.",
                "Cuaja la tortilla por ambos lados, dándole la vuelta con un plato.",
            ],
        ),
        (
            "¿Qué me recomiendas visitar en Sevilla?",
            [
                "El Real Alcázar y la catedral son visitas obligadas.",
                "Por la tarde, pasea por el barrio de Triana y cruza el puente.",
                "¡No te vayas sin probar el salmorejo!",
            ],
        ),
        (
            "¿Puedes resumir la historia de la Alhambra?",
            [
                "La Alhambra fue construida por la dinastía nazarí en el siglo XIII.",
                "Tras 1492 pasó a manos de los Reyes Católicos.",
                "Hoy es uno de los monumentos más visitados de España.",
            ],
        ),
    ],
    "pt": [
        (
            "Qual é a melhor época para visitar o Porto?",
            [
                "A primavera e o início do outono são as estações mais agradáveis.",
                "Não deixe de provar uma francesinha e de atravessar a ponte Dom Luís I.",
            ],
        ),
        (
            "Como faço um bom café coado?",
            [
                "Use água quase fervente e despeje devagar, em movimentos circulares.",
                "A proporção ideal é de cerca de dez gramas de café para cada cem mililitros.",
            ],
        ),
    ],
    "it": [
        (
            "Come si prepara un vero risotto alla milanese?",
            [
                "Tosta il riso con il burro, poi aggiungi il brodo caldo un mestolo alla volta.",
                "Lo zafferano si aggiunge verso la fine, sciolto in un po' di brodo.",
                "Manteca con burro freddo e parmigiano, e lascia riposare un minuto.",
            ],
        ),
        (
            "Cosa vedere a Firenze in un giorno?",
            [
                "Il Duomo, Ponte Vecchio e gli Uffizi si possono visitare a piedi.",
                "Al tramonto, sali a Piazzale Michelangelo per la vista sulla città.",
                "Perché non ci fermiamo a prendere un caffè in piazza della Signoria?",
            ],
        ),
    ],
    "pl": [
        (
            "Jak przygotować pierogi ruskie?",
            [
                "Ziemniaki ugotuj, przeciśnij przez praskę i wymieszaj z twarogiem i cebulą.",
                "Ciasto rozwałkuj cienko, wykrawaj krążki szklanką i sklejaj brzegi.",
                "Gotuj pierogi w osolonej wodzie, aż wypłyną na powierzchnię.",
            ],
        ),
    ],
    "zh": [
        (
            "如何做一道简单的西红柿炒鸡蛋？",
            ["先把鸡蛋打散炒至半熟，盛出备用。", "再把西红柿切块翻炒出汁。", "然后倒入鸡蛋，加盐调味即可。"],
        ),
        (
            "请介绍一下长城的历史。",
            [
                "长城最早修建于春秋战国时期。",
                "秦始皇统一六国后将各段城墙连接起来。",
                "现在我们看到的大部分长城是明朝修建的。",
            ],
        ),
        (
            "学习编程应该从哪里开始？",
            [
                "建议先学习 Python，因为它的语法简单，资料丰富。",
                "每天坚持写一点代码，比一次学很久更有效。",
                "遇到问题时，先自己查文档，再去社区提问。",
            ],
        ),
        (
            "北京有哪些值得去的地方？",
            ["故宫、天坛和颐和园都非常值得一去。", "秋天是北京最舒服的季节，天气晴朗，不冷不热。"],
        ),
    ],
    "ja": [
        (
            "美味しい味噌汁の作り方を教えてください。",
            [
                "まず昆布とかつお節でだしを取ります。",
                "具材を入れて煮たら、火を止めてから味噌を溶かします。",
                "沸騰させると香りが飛ぶので注意してください。",
            ],
        ),
        (
            "京都で一日観光するならどこがおすすめですか？",
            [
                "朝早く伏見稲荷大社に行くと、人が少なくて静かです。",
                "午後は清水寺から祇園まで歩くのがおすすめです。",
            ],
        ),
        (
            "日本の四季について説明してください。",
            [
                "日本には春夏秋冬の四つの季節があり、それぞれに行事があります。",
                "春には桜が咲き、秋には紅葉がとても美しいです。",
                "夏は蒸し暑く、冬は地域によって大雪が降ります。",
            ],
        ),
    ],
    "ar": [
        (
            "كيف أحضّر كوبًا جيدًا من الشاي بالنعناع؟",
            [
                "اغلِ الماء ثم أضف الشاي الأخضر واتركه لبضع دقائق.",
                "أضف أوراق النعناع الطازجة والسكر حسب الرغبة.",
            ],
        ),
        (
            "ما هي أهم المعالم في القاهرة؟",
            [
                "الأهرامات وأبو الهول والمتحف المصري من أهم المعالم.",
                "أفضل وقت للزيارة هو فصل الشتاء حين يكون الجو معتدلًا.",
            ],
        ),
    ],
    "he": [
        (
            "איך מכינים חומוס ביתי?",
            [
                "משרים את הגרגרים לילה שלם ומבשלים אותם עד שהם רכים מאוד.",
                "טוחנים עם טחינה, לימון, שום ומעט מי בישול.",
            ],
        ),
        (
            "מה כדאי לראות בירושלים?",
            ["העיר העתיקה, הכותל המערבי ושוק מחנה יהודה הם חובה.", "כדאי להגיע לשוק ביום חמישי בערב."],
        ),
    ],
}
THANKS = {
    "fr": "Merci !",
    "de": "Danke!",
    "es": "¡Gracias!",
    "pt": "Obrigado!",
    "it": "Grazie!",
    "pl": "Dziękuję!",
    "zh": "谢谢！",
    "ja": "ありがとう！",
    "ar": "شكرًا جزيلًا!",
    "he": "תודה!",
}
EMOJI_LINES = [
    "Just finished my first marathon 🏃‍♀️🎉 legs are jelly but worth it!",
    "Dinner tonight: homemade ramen 🍜 with a soft egg 🥚 and lots of scallions.",
    "Reminder: standup moved to 10:30 ⏰ — bring coffee ☕.",
    "The build is green again ✅🚀 thanks everyone for the quick fixes 🙏",
    "Rainy Sunday 🌧️📚 perfect for finishing that novel.",
    "Family photo 👨‍👩‍👧‍👦 at the beach 🏖️ — flags: 🇯🇵 🇧🇷 🇫🇷 🇰🇪",
    "Rating: ⭐⭐⭐⭐☆ good food, slow service 🐢",
    "New plant baby 🌱🪴 fingers crossed I don't kill this one 🤞",
]


# ---------------------------------------------------------------------------------------------
# Record builders. Each returns (kind, source, pieces); ids are assigned at the end in file order.
# ---------------------------------------------------------------------------------------------


def piece(text: str, weight: float) -> dict:
    return {"text": text, "weight": weight}


def instruction_prompt(question: str, context: str | None = None) -> str:
    if context:
        return f"### Instruction:\n{question}\n\n### Input:\n{context}\n\n### Response:\n"
    return f"### Instruction:\n{question}\n\n### Response:\n"


def join_paragraphs(paragraphs: list[str]) -> str:
    return "\n\n".join(paragraphs)


def paragraph(rng: random.Random, sentences: list[str], lo: int, hi: int, **slots: str) -> str:
    k = min(len(sentences), rng.randint(lo, hi))
    return " ".join(s.format(**slots) for s in rng.sample(sentences, k))


def cooking(rng: random.Random, long: bool = False) -> tuple[str, str, list[str]]:
    dish, ingredients = rng.choice(DISHES)
    a, b, c, d = rng.sample(ingredients, 4)
    slots = {
        "fat": rng.choice(["olive oil", "butter", "vegetable oil"]),
        "a": a,
        "b": b,
        "c": c,
        "d": d,
        "n": str(rng.randint(2, 8)),
        "m": str(rng.choice([10, 15, 20, 25, 30, 40])),
        "t": str(rng.choice([180, 190, 200, 220])),
    }
    question = rng.choice(
        [
            f"How do I make {dish} at home?",
            f"Give me a simple recipe for {dish}.",
            f"What's the easiest way to cook {dish} for four people?",
            f"I have {a} and {b}. Can I make {dish}?",
        ]
    )
    picked = sorted(rng.sample(range(len(COOK_STEPS) - 1), rng.randint(2, 5))) + [len(COOK_STEPS) - 1]
    steps = [COOK_STEPS[i].format(**slots) for i in picked]
    parts = [
        f"Here is a simple way to make {dish}.",
        "Ingredients:\n" + "\n".join(f"- {i}" for i in ingredients),
        "Steps:\n" + "\n".join(f"{i + 1}. {s}" for i, s in enumerate(steps)),
    ]
    tips = rng.sample(COOK_TIPS, rng.randint(1, 3 if not long else 6))
    parts.append("Tips: " + " ".join(tips))
    return question, join_paragraphs(parts), tips


def history(rng: random.Random, long: bool = False) -> tuple[str, str, list[str]]:
    what, who, when, where, why = rng.choice(HISTORY)
    slots = {"what": what, "who": who, "when": when, "where": where, "why": why}
    question = rng.choice(
        [
            f"Why was {what} important?",
            f"Tell me briefly about {what}.",
            f"Who was behind {what}, and when did it happen?",
            f"Summarize the significance of {what} for a high-school student.",
        ]
    )
    key = f"The short answer is that {why}."
    # Each template at most once per answer; long answers add general prose paragraphs.
    shuffled = [
        t.format(**slots) for t in rng.sample(HISTORY_SENTENCES, rng.randint(3, len(HISTORY_SENTENCES)))
    ]
    cut = rng.randint(1, len(shuffled) - 1)
    paras = [" ".join(shuffled[:cut]), " ".join(shuffled[cut:])]
    if long:
        paras += [paragraph(rng, PROSE_SENTENCES, 3, 6) for _ in range(rng.randint(2, 4))]
    return question, join_paragraphs([key, *paras]), [key]


def travel(rng: random.Random, long: bool = False) -> tuple[str, str, list[str]]:
    city, country, spot, food, transport = rng.choice(TRAVEL)
    slots = {"city": city, "country": country, "spot": spot, "food": food, "transport": transport}
    days = rng.randint(2, 5)
    question = rng.choice(
        [
            f"I'm visiting {city} for {days} days. Any tips?",
            f"What should I see in {city}?",
            f"Plan a {days}-day trip to {city}, {country}.",
        ]
    )
    paras = [paragraph(rng, TRAVEL_SENTENCES, 2, 4, **slots)]
    if long or rng.random() < 0.5:
        paras.append(
            "\n".join(
                f"Day {i + 1}: " + t.format(**slots) for i, t in enumerate(rng.sample(TRAVEL_SENTENCES, days))
            )
        )
    key = f"Do not leave without trying {food}."
    return question, join_paragraphs(paras + [key]), [key]


def math_problem(rng: random.Random, long: bool = False) -> tuple[str, str, list[str]]:
    kind = rng.randrange(4)
    if kind == 0:
        n, p, d = rng.randint(20, 90), rng.randint(2, 9), rng.randint(5, 7)
        q = (
            f"A bakery sells {n} loaves of bread a day at ${p} each. How much money does it take in "
            f"over {d} days?"
        )
        steps = [
            f"Each day the bakery earns {n} × {p} = ${n * p}.",
            f"Over {d} days that is {n * p} × {d} = ${n * p * d}.",
        ]
        ans = f"${n * p * d}"
    elif kind == 1:
        speed, hours = rng.randint(40, 110), rng.randint(2, 6)
        q = f"A train travels at {speed} km/h for {hours} hours. How far does it go?"
        steps = [f"Distance is speed times time: {speed} × {hours} = {speed * hours} km."]
        ans = f"{speed * hours} km"
    elif kind == 2:
        total, a = rng.randint(30, 60), rng.randint(5, 15)
        b = rng.randint(3, total - a - 3)
        q = (
            f"Maria has {total} marbles. She gives {a} to her brother and {b} to her friend. "
            "How many marbles does she have left?"
        )
        steps = [
            f"She gives away {a} + {b} = {a + b} marbles.",
            f"She has {total} - {a + b} = {total - a - b} left.",
        ]
        ans = str(total - a - b)
    else:
        w, h = rng.randint(3, 12), rng.randint(3, 12)
        cost = rng.randint(15, 45)
        q = (
            f"A rectangular room is {w} m by {h} m. Flooring costs ${cost} per square meter. "
            "What does it cost to cover the floor?"
        )
        steps = [f"The area is {w} × {h} = {w * h} m².", f"The cost is {w * h} × {cost} = ${w * h * cost}."]
        ans = f"${w * h * cost}"
    key = f"The answer is {ans}."
    body = "Let's work through it step by step.\n" + "\n".join(steps)
    return q, body + "\n" + key, [key]


def programming(rng: random.Random, long: bool = False) -> tuple[str, str, list[str]]:
    task, lang, code = rng.choice(CODE_TASKS)
    fn, var = rng.choice(FN_NAMES), rng.choice(VAR_NAMES)
    snippet = code.format(fn=fn, var=var)
    name = LANGUAGE_NAMES[lang]
    question = rng.choice(
        [
            f"How do I {task} in {name}?",
            f"Write {name} code to {task}.",
            f"Can you show me a short {name} example that does this: {task}?",
        ]
    )
    explanation = " ".join(rng.sample(CODE_EXPLANATIONS, rng.randint(1, 3 if not long else 5)))
    key = f"```{lang}\n{snippet}```"
    return question, f"Here is one way to {task}:\n\n{key}\n\n{explanation}", [key]


TOPICS = {
    "cooking": cooking,
    "history": history,
    "travel": travel,
    "math": math_problem,
    "programming": programming,
}


MATH_NOTES = [
    "Always write down what the question asks for before you start computing.",
    "Check the units: the answer should have the same units as the quantity asked for.",
    "A quick estimate first tells you whether the final number is in the right range.",
    "Multiplication is repeated addition, so you can check the product by adding.",
    "Subtraction can be checked by adding the result back to what was taken away.",
    "Drawing a small sketch often makes a word problem much easier to read.",
    "If the numbers were smaller, would the same steps still make sense?",
]
TOPIC_EXTRAS = {
    "cooking": COOK_TIPS,
    "history": PROSE_SENTENCES,
    "travel": PROSE_SENTENCES,
    "math": MATH_NOTES,
    "programming": CODE_EXPLANATIONS,
}


def elaborate(rng: random.Random, topic: str, n_paragraphs: int) -> str:
    """Extra paragraphs that make a long answer long: topical notes mixed with general prose."""
    paras = []
    for _ in range(n_paragraphs):
        extras = rng.sample(TOPIC_EXTRAS[topic], rng.randint(1, 3))
        paras.append(" ".join(extras + rng.sample(PROSE_SENTENCES, rng.randint(2, 6))))
    return join_paragraphs(paras)


def answer_for(rng: random.Random, topic: str, p_long: float) -> tuple[str, str, list[str]]:
    """A topic's (question, answer, key phrases); with probability p_long, a long answer of 300-1500 tokens."""
    long = rng.random() < p_long
    question, answer, keys = TOPICS[topic](rng, long=long)
    if long:
        answer += "\n\n" + elaborate(rng, topic, rng.choice([2, 3, 4, 6, 8, 10, 12]))
    return question, answer, keys


def make_instruction(rng: random.Random) -> tuple[str, str, list[dict]]:
    topic = rng.choice(list(TOPICS))
    question, answer, _ = answer_for(rng, topic, 0.35)
    context = None
    if topic == "programming" and rng.random() < 0.3:
        context = "Use only the standard library and keep it short."
    elif topic == "travel" and rng.random() < 0.3:
        context = f"Budget: about {rng.choice([50, 80, 120, 200])} euros a day. Traveling with {rng.choice(['a partner', 'two kids', 'friends'])}."
    return (
        "instruction",
        f"synthetic/instruction/{topic}",
        [piece(instruction_prompt(question, context), 0.0), piece(answer, 1.0)],
    )


def split_on_phrase(text: str, phrase: str) -> list[tuple[str, bool]]:
    i = text.find(phrase)
    if i < 0:
        return [(text, False)]
    return [(t, k) for t, k in ((text[:i], False), (phrase, True), (text[i + len(phrase) :], False)) if t]


def make_weighted(rng: random.Random) -> tuple[str, str, list[dict]]:
    """An answer whose key phrases weigh 2.0, whose hedges weigh 0.5, and whose body weighs 1.0."""
    topic = rng.choice(list(TOPICS))
    question, answer, keys = answer_for(rng, topic, 0.35)
    pieces = [piece(instruction_prompt(question), 0.0)]
    spans = [(answer, False)]
    for key in keys:
        spans = [
            s for text, is_key in spans for s in ([(text, True)] if is_key else split_on_phrase(text, key))
        ]
    # Sometimes the key span carries the space before it, sometimes the boundary sits right after a space.
    for text, is_key in spans:
        pieces.append(piece(text, 2.0 if is_key else 1.0))
    if rng.random() < 0.6:
        pieces.append(piece(" " + rng.choice(HEDGES), 0.5))
    if rng.random() < 0.3:
        # A mid-sentence emphasis inside the last body piece: " ... word word ..." split at word boundaries.
        last = max((i for i, p in enumerate(pieces) if p["weight"] == 1.0), default=None)
        if last is not None:
            words = pieces[last]["text"].split(" ")
            if len(words) > 8:
                a = rng.randint(1, len(words) - 4)
                b = a + rng.randint(1, 3)
                pre, mid, post = " ".join(words[:a]), " ".join(words[a:b]), " ".join(words[b:])
                pieces[last : last + 1] = [piece(pre, 1.0), piece(" " + mid, 2.0), piece(" " + post, 1.0)]
    return "weighted", f"synthetic/weighted/{topic}", pieces


# Keeps chats under ~1500 tokens, so only the "overlong" records exceed 2048 tokens.
MAX_CHAT_CHARS = 6_000


def make_chat(rng: random.Random) -> tuple[str, str, list[dict]]:
    kind = rng.choice(["support", "support", "topic", "code"])
    pieces: list[dict] = []
    if rng.random() < 0.5:
        system = (
            "You are a friendly customer support agent for an online store."
            if kind == "support"
            else "You are a helpful, concise assistant."
        )
        pieces.append(piece(f"<|system|>\n{system}\n", 0.0))
    if kind == "support":
        customer, agent = rng.choice(CUSTOMER_NAMES), rng.choice(AGENT_NAMES)
        issue, reply = rng.choice(SUPPORT_ISSUES)
        order = f"#{rng.randint(100000, 999999)}"
        turns = [
            (
                f"Hi, {issue}. The order number is {order}.",
                f"Hi {customer}, this is {agent}. Thanks for the order number. {reply}",
            ),
            (
                rng.choice(
                    [
                        "Okay, thanks. How long will that take?",
                        "Great. Do I need to do anything else?",
                        "Thanks! Will I get an email confirmation?",
                    ]
                ),
                rng.choice(
                    [
                        "You'll get an email as soon as it's done, usually within a day.",
                        "Nothing else is needed on your side. I've added a note to the order.",
                        "Yes, a confirmation email is on its way to you now.",
                    ]
                ),
            ),
        ]
        if rng.random() < 0.5:
            turns.append(
                (
                    "That's all, thank you so much!",
                    f"You're welcome, {customer}! Have a lovely day, and reach out anytime.",
                )
            )
    else:
        topic = "programming" if kind == "code" else rng.choice(["cooking", "history", "travel", "math"])
        turns = []
        for _ in range(rng.randint(1, 6)):
            question, answer, _ = answer_for(rng, topic, 0.15)
            if (
                turns
                and sum(len(q) + len(a) for q, a in turns) + len(question) + len(answer) > MAX_CHAT_CHARS
            ):
                break
            turns.append((question, answer))
    for user, assistant in turns:
        pieces.append(piece(f"<|user|>\n{user}\n<|assistant|>\n", 0.0))
        pieces.append(piece(f"{assistant}\n", 1.0))
    return "chat", f"synthetic/chat/{kind}", pieces


def make_prose(rng: random.Random) -> tuple[str, str, list[dict]]:
    n_par = rng.choice([1, 1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24])
    paras = []
    for i in range(n_par):
        first = [rng.choice(PROSE_OPENERS)] if i == 0 else []
        paras.append(" ".join(first + rng.sample(PROSE_SENTENCES, rng.randint(3, 8))))
    return "prose", "synthetic/prose", [piece(join_paragraphs(paras) + "\n", 1.0)]


def make_multilingual(rng: random.Random) -> tuple[str, str, list[dict]]:
    lang = rng.choice([*MULTI, "emoji", "emoji"])
    if lang == "emoji":
        lines = rng.sample(EMOJI_LINES, rng.randint(1, 4))
        if rng.random() < 0.5:
            return "multilingual", "synthetic/multilingual/emoji", [piece("\n".join(lines) + "\n", 1.0)]
        return (
            "multilingual",
            "synthetic/multilingual/emoji",
            [
                piece("<|user|>\nWrite a cheerful status update with emoji.\n<|assistant|>\n", 0.0),
                piece("\n".join(lines) + "\n", 1.0),
            ],
        )
    question, answers = rng.choice(MULTI[lang])
    sep = "" if lang in ("zh", "ja") else " "
    answer = sep.join(answers)
    form = rng.choice(["instruction", "chat", "prose"])
    src = f"synthetic/multilingual/{lang}"
    if form == "instruction":
        return "multilingual", src, [piece(instruction_prompt(question), 0.0), piece(answer, 1.0)]
    if form == "chat":
        pieces = [piece(f"<|user|>\n{question}\n<|assistant|>\n", 0.0), piece(answer + "\n", 1.0)]
        if rng.random() < 0.4:
            pieces += [piece(f"<|user|>\n{THANKS[lang]}\n<|assistant|>\n", 0.0), piece("😊👍\n", 1.0)]
        return "multilingual", src, pieces
    # Prose: one or two answers of the language, sometimes with one key sentence of weight 2.
    sentences = [s for _, a in rng.sample(MULTI[lang], min(2, len(MULTI[lang]))) for s in a]
    if rng.random() < 0.5:
        k = rng.randrange(len(sentences))
        before, after = sep.join(sentences[:k]), sep.join(sentences[k + 1 :])
        pieces = [piece(before + sep, 1.0)] if before else []
        pieces.append(piece(sentences[k], 2.0))
        pieces.append(piece((sep + after if after else "") + "\n", 1.0))
        return "multilingual", src, pieces
    return "multilingual", src, [piece(sep.join(sentences) + "\n", 1.0)]


TINY = [
    [piece("Hello!", 1.0)],
    [piece("### Instruction:\nSay yes.\n\n### Response:\n", 0.0), piece("Yes.", 1.0)],
    [piece("<|user|>\nhi\n<|assistant|>\n", 0.0), piece("Hi! How can I help?\n", 1.0)],
    [piece("2 + 2 = ", 0.0), piece("4", 2.0)],
    [piece("Q: Capital of France?\nA: ", 0.0), piece("Paris", 1.0), piece(".", 0.5)],
    [piece("OK", 1.0)],
    [piece("👋", 1.0)],
    [piece("東京", 1.0)],
]


def make_overlong(rng: random.Random, index: int) -> tuple[str, str, list[dict]]:
    """A long multi-section handbook (20-40k characters), weighted like an instruction or as plain prose."""
    target = rng.randint(20_000, 38_000)
    title = [
        "The Home Cook's Handbook",
        "A Traveler's Companion to Ten Cities",
        "Programming Patterns, Explained",
        "A Short History of Big Ideas",
        "Customer Support Playbook",
    ][index % 5]
    sections: list[str] = [f"# {title}\n"]
    makers = [cooking, travel, programming, history, math_problem]
    i = 0
    while sum(len(s) for s in sections) < target:
        i += 1
        maker = makers[(index + i) % len(makers)]
        question, answer, _ = maker(rng, long=True)
        sections.append(f"## {i}. {question}\n\n{answer}\n\n" + paragraph(rng, PROSE_SENTENCES, 3, 6) + "\n")
    body = "\n".join(sections)
    src = "synthetic/overlong"
    if index % 2 == 0:
        return (
            "overlong",
            src,
            [piece(instruction_prompt(f'Write a complete guide titled "{title}".'), 0.0), piece(body, 1.0)],
        )
    return "overlong", src, [piece(body, 1.0)]


# Planned mix (kind -> count). Records are shuffled once with the seeded RNG, so the order is stable.
PLAN = {"instruction": 120, "weighted": 60, "chat": 80, "prose": 50, "multilingual": 80}
N_OVERLONG = 4
BUILDERS = {
    "instruction": make_instruction,
    "weighted": make_weighted,
    "chat": make_chat,
    "prose": make_prose,
    "multilingual": make_multilingual,
}


def build_records(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    made: list[tuple[str, str, list[dict]]] = []
    for kind, count in PLAN.items():
        made.extend(BUILDERS[kind](rng) for _ in range(count))
    made.extend(("tiny", "synthetic/tiny", pieces) for pieces in TINY)
    made.extend(make_overlong(rng, i) for i in range(N_OVERLONG))
    rng.shuffle(made)
    counters: dict[str, int] = {}
    records = []
    for kind, source, pieces in made:
        counters[kind] = counters.get(kind, 0) + 1
        pieces = [p for p in pieces if p["text"]]
        records.append({"pieces": pieces, "source": source, "id": f"{kind}-{counters[kind]:04d}"})
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "raw.jsonl")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    records = build_records(args.seed)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    kinds: dict[str, int] = {}
    for rec in records:
        kind = rec["id"].rsplit("-", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    chars = sum(len(p["text"]) for rec in records for p in rec["pieces"])
    print(f"wrote {len(records)} records, {chars} characters, {args.out.stat().st_size} bytes to {args.out}")
    print("mix: " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))


if __name__ == "__main__":
    main()
