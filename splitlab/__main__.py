from splitlab.commands import main

main()
