"""``kubectl rbak``: the kubectl plugin that triggers, follows and inspects rbak's custom resources."""
