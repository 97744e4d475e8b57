from posttrain_sdk.cli import main

main()
