from child_ledger import Ledger

ledger = Ledger()  # LEDGER_URL, else http://127.0.0.1:8080
events = ({"key": f"evt-{i}", "payload": {"event": i, "customer": f"c-{i % 37}"}} for i in range(1000))
parent = ledger.register("quickstart", "events", events)  # every row written before any is claimed
print(parent["parent_id"], parent["state"], parent["counts"]["total"])
