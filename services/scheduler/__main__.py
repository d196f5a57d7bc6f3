from services.scheduler.main import main

main()
