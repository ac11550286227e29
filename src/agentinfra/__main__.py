"""`python -m agentinfra`: the same CLI as the `agentinfra` console script."""

from agentinfra.cli import main

if __name__ == "__main__":
    main()
