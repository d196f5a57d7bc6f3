from longrun.services.worker.main import main

main()
