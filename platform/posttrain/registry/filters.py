"""List filters of the registry API (django-filter): `?name=` matches part of the name."""

from __future__ import annotations

import django_filters

from posttrain.registry.models import Dataset, ModelAsset, RewardFunction


class ModelAssetFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name (any case).")
    architecture = django_filters.CharFilter(
        lookup_expr="iexact", help_text="Architecture class, e.g. Qwen2ForCausalLM."
    )
    source = django_filters.ChoiceFilter(choices=ModelAsset.Source.choices)

    class Meta:
        model = ModelAsset
        fields = ["name", "architecture", "source", "source_run"]


class DatasetFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name (any case).")
    format = django_filters.ChoiceFilter(choices=Dataset.Format.choices)
    sha256 = django_filters.CharFilter(help_text="Content hash.")

    class Meta:
        model = Dataset
        fields = ["name", "format", "sha256"]


class RewardFunctionFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name (any case).")
    kind = django_filters.ChoiceFilter(choices=RewardFunction.Kind.choices)

    class Meta:
        model = RewardFunction
        fields = ["name", "kind"]
