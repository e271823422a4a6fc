from splitlab.cli import main

main()
