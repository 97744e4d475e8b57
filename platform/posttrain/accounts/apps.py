from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "posttrain.accounts"
    label = "accounts"
    verbose_name = "Accounts and roles"
