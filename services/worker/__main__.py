from services.worker.main import main

main()
