from longrun.services.outbox_relay.main import main

main()
