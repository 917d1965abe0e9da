//! iLO clients: RIBCL over HTTPS (iLO 4) and Redfish (iLO 5/6 and other Redfish BMCs).
