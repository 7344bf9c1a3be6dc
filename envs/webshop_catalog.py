"""A synthetic WebShop catalog: products over ten categories, with their instructions.

WebShop's 1.18M scraped products cannot be downloaded on a fresh machine, so this draws a
deterministic catalog from a seed, written as WebShop's own files (`items_shuffle.json`
records, `items_ins_v2.json` attributes and instructions) and read by the same loader
as the original (envs.webshop_data.catalog_from_records).
"""

from __future__ import annotations

import functools
from typing import Dict, List, Tuple

import numpy as np

from envs import webshop_data

# category -> (breadcrumb, product types, attributes, option groups, price range)
_CATEGORIES = {
    "grocery": ("Grocery & Gourmet Food › Snacks › {type}",
                ("crackers", "granola bars", "trail mix", "potato chips", "cookies",
                 "protein bars", "popcorn", "beef jerky"),
                ("gluten free", "sugar free", "non gmo", "organic", "low carb", "keto friendly",
                 "vegan", "high protein", "low sodium", "dairy free"),
                {"size": ("6 pack", "12 pack", "24 pack"),
                 "flavor": ("sea salt", "cheddar", "honey", "chocolate", "barbecue")},
                (4.0, 45.0)),
    "beauty": ("Beauty & Personal Care › Skin Care › {type}",
               ("face moisturizer", "body lotion", "lip balm", "face serum", "sunscreen",
                "eye cream", "face wash"),
               ("paraben free", "fragrance free", "cruelty free", "long lasting", "vegan",
                "dermatologist tested", "oil free", "natural ingredients", "hypoallergenic"),
               {"size": ("1 fl oz", "2 fl oz", "8 fl oz"),
                "scent": ("unscented", "lavender", "citrus", "vanilla")},
               (6.0, 60.0)),
    "hair": ("Beauty & Personal Care › Hair Care › {type}",
             ("shampoo", "conditioner", "hair oil", "hair mask", "dry shampoo", "hair spray"),
             ("sulfate free", "paraben free", "color safe", "for dry hair", "natural ingredients",
              "cruelty free", "anti frizz", "long lasting"),
             {"size": ("8 fl oz", "12 fl oz", "32 fl oz")},
             (5.0, 40.0)),
    "men_clothing": ("Clothing, Shoes & Jewelry › Men › {type}",
                     ("t-shirt", "polo shirt", "hoodie", "jogger pants", "cargo shorts",
                      "dress shirt", "rain jacket"),
                     ("machine wash", "relaxed fit", "slim fit", "moisture wicking",
                      "button closure", "long sleeve", "short sleeve", "quick drying",
                      "cotton spandex"),
                     {"size": ("small", "medium", "large", "x-large"),
                      "color": ("black", "navy blue", "heather gray", "olive green", "white")},
                     (12.0, 80.0)),
    "women_shoes": ("Clothing, Shoes & Jewelry › Women › Shoes › {type}",
                    ("running shoes", "ankle boots", "sandals", "slip on sneakers", "loafers",
                     "flip flops"),
                    ("non slip", "rubber sole", "memory foam", "arch support", "lace up",
                     "water resistant", "lightweight", "wide width"),
                    {"size": ("6", "7", "8", "9", "10"),
                     "color": ("black", "white", "beige", "pink", "brown")},
                    (18.0, 95.0)),
    "home": ("Home & Kitchen › Furniture › {type}",
             ("office chair", "bookshelf", "coffee table", "tv stand", "bar stool",
              "storage ottoman", "nightstand"),
             ("easy assembly", "solid wood", "storage space", "mid century", "living room",
              "metal frame", "height adjustable", "space saving"),
             {"color": ("walnut", "white", "black", "gray", "espresso")},
             (35.0, 240.0)),
    "bedding": ("Home & Kitchen › Bedding › {type}",
                ("sheet set", "comforter", "pillow", "duvet cover", "mattress topper",
                 "weighted blanket"),
                ("machine washable", "queen size", "king size", "memory foam", "cooling",
                 "hypoallergenic", "deep pocket", "soft microfiber"),
                {"size": ("twin", "full", "queen", "king"),
                 "color": ("white", "gray", "navy", "sage green", "ivory")},
                (20.0, 150.0)),
    "electronics": ("Electronics › Accessories › {type}",
                    ("phone case", "usb c cable", "wireless charger", "screen protector",
                     "bluetooth speaker", "earbuds", "power bank"),
                    ("fast charging", "high speed", "easy install", "water resistant",
                     "noise cancelling", "wireless bluetooth", "long battery life",
                     "shockproof"),
                    {"color": ("black", "white", "blue", "red"),
                     "size": ("3 ft", "6 ft", "10 ft")},
                    (8.0, 70.0)),
    "pet": ("Pet Supplies › Dogs › {type}",
            ("dog food", "dog treats", "chew toy", "dog bed", "dog leash", "dog shampoo"),
            ("grain free", "natural ingredients", "for small dogs", "for large dogs",
             "long lasting", "easy clean", "made in usa", "high protein"),
            {"size": ("small", "medium", "large"),
             "flavor": ("chicken", "beef", "salmon", "peanut butter")},
            (6.0, 65.0)),
    "health": ("Health & Household › Vitamins › {type}",
               ("multivitamin", "vitamin d3", "fish oil", "probiotic", "magnesium",
                "collagen powder", "melatonin"),
               ("non gmo", "gluten free", "sugar free", "vegan", "third party tested",
                "easy to swallow", "high potency", "dairy free"),
               {"size": ("30 count", "60 count", "120 count")},
               (7.0, 55.0)),
}
_BRANDS = ("Acorn", "Bluebell", "Cedar", "Dune", "Ember", "Fable", "Grove", "Harbor", "Iris",
           "Juniper", "Kestrel", "Lumen", "Maple", "Nimbus", "Orchard", "Pioneer", "Quill",
           "Ridge", "Summit", "Tidal", "Umber", "Vale", "Willow", "Yarrow", "Zephyr")
_STYLES = ("classic", "premium", "everyday", "deluxe", "essential", "original", "signature")


def synthetic_records(num_products: int, seed: int) -> Tuple[List[dict], Dict[str, dict]]:
  """`num_products` products (items_shuffle.json records) and their attributes and
  instructions (items_ins_v2.json), drawn from `seed`; the same arguments give the same
  files."""
  rng = np.random.default_rng(seed)
  names = sorted(_CATEGORIES)
  records, instructions = [], {}
  for n in range(num_products):
    category = names[n % len(names)]
    crumb, types, attribute_pool, option_pool, (low, high) = _CATEGORIES[category]
    kind = str(rng.choice(types))
    brand, style = str(rng.choice(_BRANDS)), str(rng.choice(_STYLES))
    attributes = [str(a) for a in rng.choice(attribute_pool, int(rng.integers(2, 5)),
                                             replace=False)]
    in_title = attributes[:int(rng.integers(1, 3))]
    title = f"{brand} {style.title()} {' '.join(a.title() for a in in_title)} {kind.title()}"
    groups = {g: [str(v) for v in rng.choice(vs, int(rng.integers(2, len(vs) + 1)),
                                             replace=False)]
              for g, vs in option_pool.items() if rng.random() < 0.85}
    price = round(float(rng.uniform(low, high)), 2)
    asin = f"B{n:05d}"
    records.append({
        "asin": asin, "name": title, "category": category,
        "query": f"{kind}", "product_category": crumb.format(type=kind.title()),
        "full_description": (f"{brand} {kind} made to be {attributes[-1]}. "
                             f"A {style} choice for every day."),
        "small_description": [f"{a.capitalize()}" for a in attributes]
                             + [f"From {brand}, {style} quality"],
        "pricing": f"${price:.2f}",
        "customization_options": {g: [{"value": v, "image": None} for v in vs]
                                  for g, vs in groups.items()},
        "images": [""],
    })
    wanted = [str(a) for a in rng.choice(attributes, int(rng.integers(1, min(3, len(attributes)) + 1)),
                                          replace=False)]
    chosen = {g: str(rng.choice(vs)) for g, vs in groups.items()}
    option_text = ", and ".join(f"{g}: {v}" for g, v in chosen.items())
    instructions[asin] = {
        "attributes": attributes,
        "instruction": (f"i am looking for {' and '.join(wanted)} {kind}"
                        + (f" with {option_text}" if option_text else "")),
        "instruction_attributes": wanted,
        "instruction_options": chosen,
    }
  return records, instructions


@functools.lru_cache(maxsize=4)
def synthetic_catalog(num_products: int = 3000, seed: int = 0) -> webshop_data.Catalog:
  if num_products < 10:
    raise ValueError(f"WebShop num_products must be >= 10, got {num_products}")
  records, instructions = synthetic_records(num_products, seed)
  return webshop_data.catalog_from_records(records, instructions,
                                           source=f"synthetic:{num_products}:{seed}")
