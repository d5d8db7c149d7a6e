"""Cloud and profile providers of the inventory (GCE, AWS, Azure, Alibaba, OKE,
CoreWeave CKS, webhook). The interface is in ``base``; ``discovery`` detects the
cloud and wires the providers from the flags."""
