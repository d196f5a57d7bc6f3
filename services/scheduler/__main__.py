from longrun.services.scheduler.main import main

main()
