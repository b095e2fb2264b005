"""A warehouse system to test against: the API the service calls, with faults on demand.

Not part of the service's package: the tests, the compose stack and the demo run it
(``python -m warehouse_simulator --port 8090``). :class:`WarehouseSimulator` is the warehouse
(its orders, keys and knobs) and an ASGI app; :class:`SimulatorServer` serves it with uvicorn
on a real socket.
"""

from warehouse_simulator.app import WarehouseSimulator
from warehouse_simulator.knobs import Faults
from warehouse_simulator.orders import Cancellation, Order
from warehouse_simulator.server import SimulatorServer

__all__ = ["Cancellation", "Faults", "Order", "SimulatorServer", "WarehouseSimulator"]
