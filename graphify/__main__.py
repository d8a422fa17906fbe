from graphify.cli import main

main()
