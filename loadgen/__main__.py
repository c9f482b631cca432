from loadgen.entry import main

main()
