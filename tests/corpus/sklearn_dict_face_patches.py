"""scikit-learn "Online learning of a dictionary of parts of faces": ``MiniBatchKMeans`` fed
chunks of image patches through ``partial_fit``; patches drawn with a ``RandomState`` the loop
shares with the estimator.

Source: scikit-learn/scikit-learn examples/cluster/plot_dict_face_patches.py
commit 02baf5c3c6102c14cb02df82ffb4cf3102ee5db2, BSD-3-Clause.

Shape: multi-cell, as the example's ``# %%`` sections: "Load the data" in a notebook cell, "Learn
the dictionary of images" as the fit cell (the estimator is built there); scikit-learn
``partial_fit`` of an estimator without ``coef_``.  "Plot the results" is left out.

Replaced: ``datasets.fetch_olivetti_faces()`` (a download) by ``datasets.load_digits()``, which
ships with scikit-learn (its first 100 8x8 images).  Sizes: 20x20 patches -> 4x4, 81 clusters
-> 16, 6 passes over the images -> 2 (400 faces -> 100 digits).

Every rank sees the same images and draws the same patches (``RandomState(0)`` in the cell),
so one process on the full data is the reference.
"""

SOURCE = {"repo": "scikit-learn/scikit-learn", "path": "examples/cluster/plot_dict_face_patches.py",
          "commit": "02baf5c3c6102c14cb02df82ffb4cf3102ee5db2", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "sklearn partial_fit (MiniBatchKMeans, built in the cell)"}

CELLS = [
    '''
from sklearn import datasets

# REPLACED: faces = datasets.fetch_olivetti_faces()   (a download)
faces = datasets.load_digits()
faces.images = faces.images[:100]
''',
]

FIT = '''
import time

import numpy as np

from sklearn.cluster import MiniBatchKMeans
from sklearn.feature_extraction.image import extract_patches_2d

print("Learning the dictionary... ")
rng = np.random.RandomState(0)
kmeans = MiniBatchKMeans(n_clusters=16, random_state=rng, verbose=True)  # SIZE: 81 clusters
patch_size = (4, 4)  # SIZE: (20, 20)

buffer = []
t0 = time.time()

# The online learning part: cycle over the whole dataset 6 times
index = 0
for _ in range(2):  # SIZE: 6
    for img in faces.images:
        data = extract_patches_2d(img, patch_size, max_patches=50, random_state=rng)
        data = np.reshape(data, (len(data), -1))
        buffer.append(data)
        index += 1
        if index % 10 == 0:
            data = np.concatenate(buffer, axis=0)
            data -= np.mean(data, axis=0)
            data /= np.std(data, axis=0)
            kmeans.partial_fit(data)
            buffer = []
        if index % 100 == 0:
            print("Partial fit of %4i out of %i" % (index, 6 * len(faces.images)))

dt = time.time() - t0
print("done in %.2fs." % dt)
'''

SHARD = None   # faces is a Bunch: every rank reads all of it
RETURN = "kmeans"
SEED = 0
JUDGE = "single"


def progress(ns, objs):
    """Mean squared distance of standardised patches to their nearest centre: 16 patches taken
    as centres (before) against the learnt centres (after)."""
    import numpy as np
    from sklearn.feature_extraction.image import extract_patches_2d

    rng = np.random.RandomState(1)
    data = np.concatenate([extract_patches_2d(img, (4, 4), max_patches=50, random_state=rng)
                           .reshape(-1, 16) for img in ns["faces"].images[:20]])
    data = (data - data.mean(0)) / data.std(0)

    def inertia(centres):
        return float(((data[:, None, :] - centres[None]) ** 2).sum(-1).min(1).mean())

    return inertia(data[rng.choice(len(data), 16, replace=False)]), inertia(objs["kmeans"].cluster_centers_)
