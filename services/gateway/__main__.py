from longrun.services.gateway.main import main

main()
