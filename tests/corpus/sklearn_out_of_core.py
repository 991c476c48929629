"""scikit-learn "Out-of-core classification of text documents": a HashingVectorizer and four
incremental classifiers (SGDClassifier, Perceptron, MultinomialNB, PassiveAggressiveClassifier)
fed mini-batches of a document stream through ``partial_fit``, with the accuracy on a held-out
set recorded after each mini-batch.

Source: scikit-learn/scikit-learn examples/applications/plot_out_of_core_classification.py
commit 02cc97a48f5f247288403106b71c669dabb281d7, BSD-3-Clause.

Shape: multi-cell, as the example's ``# %%`` sections: imports; "Reuters Dataset related
routines"; and the "Main" section (vectorizer, stream, classifiers built in a dict, held-out set,
main loop) as the fit cell.  scikit-learn ``partial_fit``, estimators created inside the cell.
The "Plot results" section is left out.

Replaced: ``stream_reuters_documents`` (downloads the Reuters-21578 archive with
``urlretrieve``, untars it and parses the SGML files) by a generator of the same kind of
documents (dicts with 'title', 'body', 'topics'), made from a fixed seed: 1500 documents over a
300-word vocabulary, about 10% without topics, about a third with topic "acq", whose words lean
towards a part of the vocabulary.  Sizes: ``n_features`` 2**18 -> 2**14, the held-out set
1000 -> 200 documents (``n_test_documents`` and the literal in ``get_minibatch(data_stream,
1000)``), mini-batches of 1000 -> 100.

Judged against ``wrap()``: SGDClassifier and PassiveAggressiveClassifier shuffle each
mini-batch with the per-rank global numpy RNG, so no single process reproduces them.  The
``wrap()`` run wraps every classifier of the dict right after the dict is built.
"""

SOURCE = {"repo": "scikit-learn/scikit-learn",
          "path": "examples/applications/plot_out_of_core_classification.py",
          "commit": "02cc97a48f5f247288403106b71c669dabb281d7", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "sklearn partial_fit (estimators built in the cell, in a dict)"}

CELLS = [
    '''
# Authors: The scikit-learn developers
# SPDX-License-Identifier: BSD-3-Clause

import itertools
import re
import sys
import tarfile
import time
from hashlib import sha256
from html.parser import HTMLParser
from pathlib import Path
from urllib.request import urlretrieve

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import rcParams

from sklearn.datasets import get_data_home
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import PassiveAggressiveClassifier, Perceptron, SGDClassifier
from sklearn.naive_bayes import MultinomialNB


def _not_in_sphinx():
    # Hack to detect whether we are running by the sphinx builder
    return "__file__" in globals()
''',
    '''
class ReutersParser(HTMLParser):
    """Utility class to parse a SGML file and yield documents one at a time."""

    def __init__(self, encoding="latin-1"):
        HTMLParser.__init__(self)
        self._reset()
        self.encoding = encoding

    def handle_starttag(self, tag, attrs):
        method = "start_" + tag
        getattr(self, method, lambda x: None)(attrs)

    def handle_endtag(self, tag):
        method = "end_" + tag
        getattr(self, method, lambda: None)()

    def _reset(self):
        self.in_title = 0
        self.in_body = 0
        self.in_topics = 0
        self.in_topic_d = 0
        self.title = ""
        self.body = ""
        self.topics = []
        self.topic_d = ""

    def parse(self, fd):
        self.docs = []
        for chunk in fd:
            self.feed(chunk.decode(self.encoding))
            for doc in self.docs:
                yield doc
            self.docs = []
        self.close()

    def handle_data(self, data):
        if self.in_body:
            self.body += data
        elif self.in_title:
            self.title += data
        elif self.in_topic_d:
            self.topic_d += data

    def start_reuters(self, attributes):
        pass

    def end_reuters(self):
        self.body = re.sub(r"\\s+", r" ", self.body)
        self.docs.append(
            {"title": self.title, "body": self.body, "topics": self.topics}
        )
        self._reset()

    def start_title(self, attributes):
        self.in_title = 1

    def end_title(self):
        self.in_title = 0

    def start_body(self, attributes):
        self.in_body = 1

    def end_body(self):
        self.in_body = 0

    def start_topics(self, attributes):
        self.in_topics = 1

    def end_topics(self):
        self.in_topics = 0

    def start_d(self, attributes):
        self.in_topic_d = 1

    def end_d(self):
        self.in_topic_d = 0
        self.topics.append(self.topic_d)
        self.topic_d = ""


def stream_reuters_documents(data_path=None):
    """Iterate over documents of the Reuters dataset.

    REPLACED: the download of the Reuters-21578 archive, its extraction and the parsing of its
    SGML files, by generated documents of the same form, from a fixed seed.

    Documents are represented as dictionaries with 'body' (str),
    'title' (str), 'topics' (list(str)) keys.

    """
    import random

    rng = random.Random(0)
    vocab = ["word%d" % i for i in range(300)]
    for _ in range(1500):
        r = rng.random()
        topics = [] if r < 0.1 else ["acq"] if r < 0.4 else [rng.choice(["earn", "trade", "crude"])]
        lean = vocab[:30] if "acq" in topics else vocab[30:60]
        words = [rng.choice(lean) if rng.random() < 0.15 else rng.choice(vocab) for _ in range(40)]
        yield {"title": " ".join(words[:6]), "body": " ".join(words[6:]), "topics": topics}
''',
]

FIT = '''
vectorizer = HashingVectorizer(
    decode_error="ignore", n_features=2**14, alternate_sign=False  # SIZE: 2**18
)


# Iterator over parsed Reuters SGML files.
data_stream = stream_reuters_documents()

# We learn a binary classification between the "acq" class and all the others.
# "acq" was chosen as it is more or less evenly distributed in the Reuters
# files. For other datasets, one should take care of creating a test set with
# a realistic portion of positive instances.
all_classes = np.array([0, 1])
positive_class = "acq"

# Here are some classifiers that support the `partial_fit` method
partial_fit_classifiers = {
    "SGD": SGDClassifier(max_iter=5),
    "Perceptron": Perceptron(),
    "NB Multinomial": MultinomialNB(alpha=0.01),
    "Passive-Aggressive": PassiveAggressiveClassifier(),
}


def get_minibatch(doc_iter, size, pos_class=positive_class):
    """Extract a minibatch of examples, return a tuple X_text, y.

    Note: size is before excluding invalid docs with no topics assigned.

    """
    data = [
        ("{title}\\n\\n{body}".format(**doc), pos_class in doc["topics"])
        for doc in itertools.islice(doc_iter, size)
        if doc["topics"]
    ]
    if not len(data):
        return np.asarray([], dtype=int), np.asarray([], dtype=int)
    X_text, y = zip(*data)
    return X_text, np.asarray(y, dtype=int)


def iter_minibatches(doc_iter, minibatch_size):
    """Generator of minibatches."""
    X_text, y = get_minibatch(doc_iter, minibatch_size)
    while len(X_text):
        yield X_text, y
        X_text, y = get_minibatch(doc_iter, minibatch_size)


# test data statistics
test_stats = {"n_test": 0, "n_test_pos": 0}

# First we hold out a number of examples to estimate accuracy
n_test_documents = 200  # SIZE: 1000
tick = time.time()
X_test_text, y_test = get_minibatch(data_stream, 200)  # SIZE: 1000
parsing_time = time.time() - tick
tick = time.time()
X_test = vectorizer.transform(X_test_text)
vectorizing_time = time.time() - tick
test_stats["n_test"] += len(y_test)
test_stats["n_test_pos"] += sum(y_test)
print("Test set is %d documents (%d positive)" % (len(y_test), sum(y_test)))


def progress(cls_name, stats):
    """Report progress information, return a string."""
    duration = time.time() - stats["t0"]
    s = "%20s classifier : \\t" % cls_name
    s += "%(n_train)6d train docs (%(n_train_pos)6d positive) " % stats
    s += "%(n_test)6d test docs (%(n_test_pos)6d positive) " % test_stats
    s += "accuracy: %(accuracy).3f " % stats
    s += "in %.2fs (%5d docs/s)" % (duration, stats["n_train"] / duration)
    return s


cls_stats = {}

for cls_name in partial_fit_classifiers:
    stats = {
        "n_train": 0,
        "n_train_pos": 0,
        "accuracy": 0.0,
        "accuracy_history": [(0, 0)],
        "t0": time.time(),
        "runtime_history": [(0, 0)],
        "total_fit_time": 0.0,
    }
    cls_stats[cls_name] = stats

get_minibatch(data_stream, n_test_documents)
# Discard test set

# We will feed the classifier with mini-batches of 1000 documents; this means
# we have at most 1000 docs in memory at any time.  The smaller the document
# batch, the bigger the relative overhead of the partial fit methods.
minibatch_size = 100  # SIZE: 1000

# Create the data_stream that parses Reuters SGML files and iterates on
# documents as a stream.
minibatch_iterators = iter_minibatches(data_stream, minibatch_size)
total_vect_time = 0.0

# Main loop : iterate on mini-batches of examples
for i, (X_train_text, y_train) in enumerate(minibatch_iterators):
    tick = time.time()
    X_train = vectorizer.transform(X_train_text)
    total_vect_time += time.time() - tick

    for cls_name, cls in partial_fit_classifiers.items():
        tick = time.time()
        # update estimator with examples in the current mini-batch
        cls.partial_fit(X_train, y_train, classes=all_classes)

        # accumulate test accuracy stats
        cls_stats[cls_name]["total_fit_time"] += time.time() - tick
        cls_stats[cls_name]["n_train"] += X_train.shape[0]
        cls_stats[cls_name]["n_train_pos"] += sum(y_train)
        tick = time.time()
        cls_stats[cls_name]["accuracy"] = cls.score(X_test, y_test)
        cls_stats[cls_name]["prediction_time"] = time.time() - tick
        acc_history = (cls_stats[cls_name]["accuracy"], cls_stats[cls_name]["n_train"])
        cls_stats[cls_name]["accuracy_history"].append(acc_history)
        run_history = (
            cls_stats[cls_name]["accuracy"],
            total_vect_time + cls_stats[cls_name]["total_fit_time"],
        )
        cls_stats[cls_name]["runtime_history"].append(run_history)

        if i % 3 == 0:
            print(progress(cls_name, cls_stats[cls_name]))
    if i % 3 == 0:
        print("\\n")
'''

SHARD = None   # the stream is made inside the cell: every rank reads all of it
RETURN = "partial_fit_classifiers,cls_stats"
JUDGED = "partial_fit_classifiers"
SEED = 0
JUDGE = "wrap"
WRAP = [("def get_minibatch(doc_iter, size, pos_class=positive_class):",
         "partial_fit_classifiers = {name: wrap(cls) for name, cls in partial_fit_classifiers.items()}\n"
         "\n\ndef get_minibatch(doc_iter, size, pos_class=positive_class):")]


def progress(ns, objs):
    """Error rate on the held-out documents: predicting the majority class (before) against the
    worst classifier's last recorded accuracy (after; the loop's own record)."""
    import itertools

    docs = [d for d in itertools.islice(ns["stream_reuters_documents"](), 200) if d["topics"]]
    positive = sum("acq" in d["topics"] for d in docs) / len(docs)
    worst = min(stats["accuracy_history"][-1][0] for stats in objs["cls_stats"].values())
    return min(positive, 1 - positive), 1 - worst
