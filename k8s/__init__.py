"""The Kubernetes launcher: KubeRay RayJob / Kubeflow PyTorchJob manifests from the plan (see launcher.py)."""
