from tba.cli import main

main()
