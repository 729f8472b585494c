import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["online"]:  # python -m bench online: the online-GRPO learning measurement
        from bench.online import main as online_main

        online_main(sys.argv[2:])
    else:
        from bench.run import main

        main()
